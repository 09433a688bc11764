"""A loaded model, tokenizer and drafters, ready to serve text requests.

This is the text edge of the runtime: it turns prompts into ids, picks
drafters by name, calls ``model.generate`` with our plugin, and times plain
HF ``generate`` side by side for ``--compare`` and the benchmark harness.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from retrieval_draft.config import DEFAULTS
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.draft import Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.registry import DraftSources, default_names, make_drafters
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.plugin.hf import generate as plugin_generate
from retrieval_draft.sessions.memory import PROCESS_MEMORY, PluginMemory
from retrieval_draft.store.reader import Datastore


@dataclass(frozen=True)
class GenerationRequest:
    """One text generation. ``sampling`` holds temperature/top_k/top_p; empty means greedy."""

    prompt: str
    chat: bool = False
    max_new_tokens: int = 128
    drafters: str = "all"
    tree_budget: int = DEFAULTS.tree_budget
    max_draft_len: int = DEFAULTS.max_draft_len
    adaptive_tree: bool = DEFAULTS.adaptive_tree
    sampling: dict = field(default_factory=dict)
    seed: int = 0


@dataclass
class Session:
    """A model and tokenizer, its opened datastores (none, one, or several), and the memory that
    outlives single calls.

    ``history`` is the model's output history in ``memory``: it learns from every
    generation that drafts from it (the drafter spec ``history``, or 'all', the plugin's own menu).
    """

    model: torch.nn.Module
    tokenizer: object
    stores: tuple[Datastore, ...] = ()
    memory: PluginMemory = PROCESS_MEMORY

    @property
    def history(self) -> HistoryDrafter:
        return self.memory.model(self.model).history

    @history.setter
    def history(self, history: HistoryDrafter) -> None:
        self.memory.model(self.model).history = history

    def encode(self, request: GenerationRequest) -> torch.Tensor:
        """Prompt ids, shape (1, L); with ``chat`` through the model's chat template."""
        if not request.prompt.strip():
            raise InvalidInputError("the prompt is empty")
        if request.chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise InvalidInputError("this model has no chat template; drop --chat")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": request.prompt}], add_generation_prompt=True, return_dict=False
            )
        else:
            ids = self.tokenizer(request.prompt)["input_ids"]
        return torch.tensor([list(ids)], dtype=torch.long)

    def drafters(self, spec: str) -> list[Drafter]:
        """Drafters named by ``spec``: a comma list of registry names (``drafters.registry``),
        or 'all': the plugin's default menu (``registry.default_names``: prompt lookup, every
        datastore's drafters, the output history, logits recycling), so the command line and
        ``--compare`` run what ``model.generate(custom_generate=...)`` runs."""
        names = [n.strip() for n in spec.split(",") if n.strip()]
        sources = DraftSources(stores=self.stores, history=self.history, recycled=self.memory.recycled(self.model))
        return make_drafters(default_names(sources) if names == ["all"] else names, sources)

    def generate_ids(self, input_ids: torch.Tensor, request: GenerationRequest, streamer=None):
        """Our generation: returns (sequence of shape (1, L + m), DecodeStats, wall seconds)."""
        stats = DecodeStats()
        started = time.perf_counter()
        out = self.model.generate(
            input_ids,
            custom_generate=plugin_generate,
            max_new_tokens=request.max_new_tokens,
            drafters=self.drafters(request.drafters),
            tree_budget=request.tree_budget,
            max_draft_len=request.max_draft_len,
            adaptive_tree=request.adaptive_tree,
            draft_streamer=streamer,
            draft_stats=stats,
            draft_seed=request.seed,
            **self._sampling_kwargs(request),
        )
        return out, stats, time.perf_counter() - started

    def plain_ids(self, input_ids: torch.Tensor, request: GenerationRequest):
        """Plain HF generate: returns (sequence of shape (1, L + m), wall seconds)."""
        torch.manual_seed(request.seed)
        started = time.perf_counter()
        out = self.model.generate(input_ids, max_new_tokens=request.max_new_tokens, **self._sampling_kwargs(request))
        return out, time.perf_counter() - started

    def prefill_seconds(self, input_ids: torch.Tensor) -> float:
        """Wall time of one forward pass over the prompt (what both methods pay first)."""
        with torch.no_grad():
            started = time.perf_counter()
            self.model(input_ids, logits_to_keep=1)
            return time.perf_counter() - started

    def generate(self, request: GenerationRequest, stream: bool = False) -> tuple[str, DecodeStats]:
        """Generate text; with ``stream``, print it to stdout as it comes."""
        from transformers import TextStreamer

        input_ids = self.encode(request)
        streamer = None
        if stream:
            streamer = TextStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        out, stats, _ = self.generate_ids(input_ids, request, streamer)
        return self.decode_new(input_ids, out), stats

    def decode_new(self, input_ids: torch.Tensor, out: torch.Tensor) -> str:
        """Text of the tokens after the prompt."""
        return self.tokenizer.decode(out[0, input_ids.shape[1] :], skip_special_tokens=True)

    def _sampling_kwargs(self, request: GenerationRequest) -> dict:
        if not request.sampling:
            return {"do_sample": False}
        return {"do_sample": True, **request.sampling}


def load_session(model_path: str | None = None, datastore_path: str | Sequence[str] | None = None) -> Session:
    """Load model and tokenizer (default SmolLM2-135M) and, optionally, datastores to draft from
    (one path or a list; bad paths are refused before the model loads)."""
    from retrieval_draft.drafters.datastore import store_specs
    from retrieval_draft.model.models import load_model_and_tokenizer

    specs = store_specs(datastore_path) if datastore_path is not None else []
    model, tokenizer = load_model_and_tokenizer(model_path)
    stores: tuple[Datastore, ...] = ()
    if specs:
        from retrieval_draft.drafters.datastore import open_checked_stores

        stores = open_checked_stores(specs, vocab_size=model.config.vocab_size, tokenizer=tokenizer)
    return Session(model=model, tokenizer=tokenizer, stores=stores)
