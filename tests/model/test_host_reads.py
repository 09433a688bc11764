"""A decode step reads the device once: the accepted tokens (and the recycling table's top-k) in one copy.

On a GPU every device -> host read (``.item()``, ``.tolist()``, ``.cpu()``,
``.numpy()``, ``int(t)``, ``bool(t)``, ...) waits for the stream. These tests
run on CPU, where nothing waits, and count the reads instead: a torch
function mode records every such call made between two tree forwards,
outside the model's own forward (HF's code is not ours to count). The
engines' device path (used off the CPU, and on CPU for plain greedy) must
make exactly one per step; forced on CPU with a logits processor or
sampling, it must give the tokens the node-by-node CPU path gives.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import retrieval_draft
from retrieval_draft.decode import verify as readout
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.decode.verify import TreeJob, read_verdicts
from retrieval_draft.tree import build_tree
from retrieval_draft.decode.verify import verify_greedy, verify_sampling
from retrieval_draft.draft import Draft
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.drafters.recycling import RecyclingDrafter
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.model import transfer
from retrieval_draft.model.tree_model import TreeModel
from tests.conftest import TINY_VOCAB, random_prompt

HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__", "nonzero"}


class HostReads(TorchFunctionMode):
    """Records device -> host reads by method name, except inside ``model``'s forward;
    ``mark()`` starts a new step."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.steps: list[list[str]] = []
        self._inside = 0
        self._hooks = [
            model.register_forward_pre_hook(lambda *_: self._enter(1)),
            model.register_forward_hook(lambda *_: self._enter(-1)),
        ]

    def _enter(self, change: int) -> None:
        self._inside += change

    def mark(self) -> None:
        self.steps.append([])

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS and not self._inside and self.steps:
            self.steps[-1].append(name)
        return func(*args, **(kwargs or {}))

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


class MarkedTreeModel(TreeModel):
    """Starts a new step of ``reads`` at every tree forward."""

    reads: HostReads

    def score(self, packed):
        self.reads.mark()
        return super().score(packed)


def reads_per_step(tiny_llama, processor=None, do_sample=False) -> tuple[list[list[str]], int]:
    """Decode a repetitive prompt with prompt lookup and recycling; the reads of each tree step."""
    model = MarkedTreeModel(tiny_llama)
    model.reads = HostReads(tiny_llama)
    drafters = [PromptLookupDrafter(), RecyclingDrafter(TINY_VOCAB)]
    options = DecodeOptions(max_new_tokens=24, eos_ids=frozenset(), do_sample=do_sample)
    generator = torch.Generator().manual_seed(1) if do_sample else None
    try:
        with model.reads:
            _, stats = speculative_decode(
                model, random_prompt(3, length=10, repeat=3), [drafters], options, processor=processor,
                generator=generator, planner=TreePlanner(tree_budget=16),
            )
    finally:
        model.reads.close()
    return model.reads.steps, stats.tree_nodes - stats.steps


@pytest.fixture
def device_reductions(monkeypatch):
    """Reductions over logits as on a GPU (torch ops, read once), not as host arrays (CPU only)."""
    monkeypatch.setattr(transfer, "computes_on_host", lambda _: False)


def test_a_greedy_step_with_recycling_reads_the_host_exactly_once(tiny_llama, device_reductions):
    steps, drafted = reads_per_step(tiny_llama)
    assert len(steps) >= 3 and drafted > 0  # real trees, not single tokens
    assert steps == [["numpy"]] * len(steps)


@pytest.mark.parametrize("do_sample", [False, True])
def test_the_device_path_reads_the_host_once_per_step_with_processors_and_sampling(tiny_llama, monkeypatch, do_sample,
                                                                                 device_reductions):
    monkeypatch.setattr(readout, "walks_on_host", lambda *_: False)
    processor = warpers() if do_sample else LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)])
    steps, drafted = reads_per_step(tiny_llama, processor, do_sample)
    assert len(steps) >= 3 and drafted > 0
    assert steps == [["numpy"]] * len(steps)


def test_a_batch_step_reads_the_host_once_for_all_rows(tiny_llama, device_reductions):
    model = MarkedTreeModel(tiny_llama)
    model.reads = HostReads(tiny_llama)
    prompts = [random_prompt(4, length=8, repeat=3)[0], random_prompt(5, length=10, repeat=2)[0]]
    ids = torch.zeros((2, 24), dtype=torch.long)
    mask = torch.zeros((2, 24), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, 24 - prompt.shape[0] :], mask[row, 24 - prompt.shape[0] :] = prompt, 1
    drafters = [[PromptLookupDrafter(), RecyclingDrafter(TINY_VOCAB)] for _ in prompts]
    planner = TreePlanner(tree_budget=8)
    try:
        with model.reads:
            speculative_decode(model, ids, drafters, DecodeOptions(max_new_tokens=16, eos_ids=frozenset()), mask, planner)
    finally:
        model.reads.close()
    assert len(model.reads.steps) >= 3
    assert model.reads.steps == [["numpy"]] * len(model.reads.steps)


def warpers() -> LogitsProcessorList:
    return LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(40), TopPLogitsWarper(0.9)])


def random_tree(rng: np.random.Generator):
    drafts = [Draft(rng.integers(0, 12, size=4), np.full(4, 0.9)) for _ in range(3)]
    return build_tree(int(rng.integers(0, 12)), drafts, budget=10)


@pytest.mark.parametrize("seed", range(6))
def test_one_read_sampling_equals_node_by_node_sampling_and_consumes_the_same_randomness(seed):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng)
    logits = torch.from_numpy(rng.normal(size=(tree.size, 12)).astype(np.float32) * 3)
    prefix = rng.integers(0, 12, size=5)
    processor = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), *warpers()])
    node_by_node, one_read = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    expected = verify_sampling(tree, logits, processor, torch.from_numpy(prefix), node_by_node)
    got = read_verdicts([TreeJob(tree, prefix, processor, one_read)], logits[None], do_sample=True)[0][0]
    assert got.accepted.tolist() == expected.accepted.tolist() and got.bonus == expected.bonus
    assert torch.equal(one_read.get_state(), node_by_node.get_state())


@pytest.mark.parametrize("seed", range(6))
def test_one_read_greedy_with_a_processor_equals_node_by_node_greedy(seed):
    rng = np.random.default_rng(100 + seed)
    tree = random_tree(rng)
    logits = torch.from_numpy(rng.normal(size=(tree.size, 12)).astype(np.float32))
    prefix = rng.integers(0, 12, size=5)
    # prompt_ignore_length of batch size 1, as HF's generate builds it: nodes must reach it one by one
    processor = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0, prompt_ignore_length=torch.tensor([2]))])
    expected = verify_greedy(tree, logits, processor, torch.from_numpy(prefix))
    got = read_verdicts([TreeJob(tree, prefix, processor)], logits[None], do_sample=False)[0][0]
    assert got.accepted.tolist() == expected.accepted.tolist() and got.bonus == expected.bonus


def plugin(model, prompt, **kwargs):
    return model.generate(
        prompt, max_new_tokens=24, custom_generate=retrieval_draft.generate, adaptive_tree=False, tree_budget=12,
        drafters=[PromptLookupDrafter(), RecyclingDrafter(TINY_VOCAB)], eos_token_id=[], **kwargs,
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_device_path_with_repetition_penalty_equals_hf_greedy(tiny_llama, monkeypatch, seed):
    prompt = random_prompt(seed, length=10, repeat=3)
    expected = tiny_llama.generate(prompt, max_new_tokens=24, do_sample=False, repetition_penalty=1.3, eos_token_id=[])
    monkeypatch.setattr(readout, "walks_on_host", lambda *_: False)
    assert torch.equal(plugin(tiny_llama, prompt, repetition_penalty=1.3), expected)


@pytest.mark.parametrize("seed", range(3))
def test_the_device_path_samples_the_cpu_paths_tokens_for_a_seed(tiny_llama, monkeypatch, seed):
    prompt = random_prompt(seed, length=10, repeat=3)
    options = dict(do_sample=True, temperature=0.7, top_k=40, top_p=0.95, draft_seed=seed)
    node_by_node = plugin(tiny_llama, prompt, **options)
    monkeypatch.setattr(readout, "walks_on_host", lambda *_: False)
    assert torch.equal(plugin(tiny_llama, prompt, **options), node_by_node)


@pytest.mark.parametrize("do_sample", [False, True])
def test_the_batch_device_path_gives_the_batch_cpu_paths_tokens(tiny_llama, monkeypatch, do_sample):
    ids = torch.stack([random_prompt(7, length=10, repeat=2)[0], random_prompt(8, length=10, repeat=2)[0]])
    ids[0, :3] = 0
    mask = (torch.arange(20) >= 3).long().repeat(2, 1)
    mask[1] = 1
    options = dict(do_sample=True, temperature=0.7, draft_seed=3) if do_sample else dict(no_repeat_ngram_size=2)
    tiny_llama.generation_config.pad_token_id = 0
    run = lambda: tiny_llama.generate(  # noqa: E731
        input_ids=ids, attention_mask=mask, max_new_tokens=16, custom_generate=retrieval_draft.generate,
        adaptive_tree=False, tree_budget=8, eos_token_id=[], **options,
    )
    node_by_node = run()
    monkeypatch.setattr(readout, "walks_on_host", lambda *_: False)
    assert torch.equal(run(), node_by_node)
