"""Static-shape verification (``cache_implementation="static"``): fixed widths over a preallocated pool.

Every output is compared with HF's own greedy ``generate`` in float32 (identical), on the eager
static path and on the compiled one (dynamo tracing the whole step as ONE graph, ``fullgraph=True``,
with the ``aot_eager`` backend: what CUDA graphs need, checked without a GPU or a C++ compile).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters
from transformers import CompileConfig

import retrieval_draft
from retrieval_draft.decode.engine import DecodeOptions, DecodeStats, speculative_decode
from retrieval_draft.drafters.registry import DraftSources, make_drafters
from retrieval_draft.errors import InvalidInputError, UnsupportedModelError
from retrieval_draft.model.static_shapes import (
    CAPACITY_STEP, StaticSteps, compiles, padded_width, static_capacity, static_widths,
)
from retrieval_draft.model.tree_model import TreeModel
from retrieval_draft.planning.cost import VerifyCost, stepped
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.tree import DraftTree
from tests.conftest import make_tiny_llama
from tests.model.zoo_models import tiny_model


def _repeating_batch(seed: int, rows: int = 3, pads=(0, 7, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, 25) left-padded prompts that repeat a 10-token block (drafts get accepted), and their mask."""
    generator = torch.Generator().manual_seed(seed)
    block = torch.randint(3, 300, (rows, 10), generator=generator)
    ids = torch.cat([block, block, block[:, :5]], dim=1)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pads[:rows]):
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    return ids, mask


def _chain(root: int, drafts: list[int]) -> DraftTree:
    """A chain: the root, then ``drafts`` one below the other."""
    n = len(drafts) + 1
    return DraftTree(tokens=np.array([root, *drafts]), parents=np.arange(-1, n - 1), depths=np.arange(n),
                     probs=np.linspace(1.0, 0.5, n))


def _forked(root: int, left: list[int], right: list[int]) -> DraftTree:
    """Two chains under one root."""
    tokens = [root, *left, *right]
    parents = [-1, *range(0, len(left))] + [0] + list(range(len(left) + 1, len(left) + len(right)))
    depths = [0, *range(1, len(left) + 1), *range(1, len(right) + 1)]
    return DraftTree(tokens=np.array(tokens), parents=np.array(parents), depths=np.array(depths),
                     probs=np.linspace(1.0, 0.5, len(tokens)))


def _ours(model, ids, mask, memory=None, **kwargs):
    return model.generate(ids, attention_mask=mask, do_sample=False, custom_generate=retrieval_draft.generate,
                          draft_memory=memory or PluginMemory(persist=False), **kwargs)


@pytest.mark.parametrize("budget", [3, 9, 32])
def test_trees_padded_to_fixed_widths_decode_as_plain_greedy_on_padded_batches(budget):
    model = make_tiny_llama()
    options = DecodeOptions(max_new_tokens=40, eos_ids=frozenset(), max_draft_len=8)
    for seed in range(4):
        ids, mask = _repeating_batch(seed)
        plain = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, eos_token_id=[])
        tree_model = TreeModel(model)
        tree_model.use_static(StaticSteps(static_widths(budget + 1)))  # 1, 4, 8, ... as compiled steps run
        tree_model.reserve = 40 + budget + 1
        drafters = [make_drafters(["prompt"], DraftSources()) for _ in range(ids.shape[0])]
        outputs, stats = speculative_decode(tree_model, ids, drafters, options, mask, TreePlanner(tree_budget=budget))
        width = ids.shape[1]
        for row, output in enumerate(outputs):
            assert np.array_equal(output, plain[row, width:].numpy()), f"seed {seed} row {row}"
        assert stats.mean_accepted > 1.0  # drafts were verified and accepted, not only lone roots
        assert stats.tree_slots > stats.tree_nodes  # trees were padded


@pytest.mark.parametrize("budget", [3, 32])
def test_static_greedy_equals_plain_greedy_through_generate(budget):
    model = make_tiny_llama()
    for seed in range(2):
        ids, mask = _repeating_batch(seed)
        plain = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
        ours = _ours(model, ids, mask, max_new_tokens=40, cache_implementation="static", adaptive_tree=False,
                     tree_budget=budget)
        assert torch.equal(ours, plain), f"seed {seed}"


def test_static_bfloat16_parts_from_plain_greedy_only_at_near_ties():
    """In bfloat16 a tree forward over the whole pool rounds differently from plain one-token
    forwards: our static output may part from plain greedy, but only where plain's own logits for
    the two tokens are tied within bf16's rounding (``tools.bench.exactness``)."""
    from tools.bench.exactness import first_divergence

    model = make_tiny_llama().to(torch.bfloat16)
    accepted = 0
    for seed in range(3):
        ids, mask = _repeating_batch(seed, rows=1)
        plain = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, output_logits=True,
                               return_dict_in_generate=True)
        stats = DecodeStats()
        ours = _ours(model, ids, mask, max_new_tokens=40, cache_implementation="static", draft_stats=stats,
                     adaptive_tree=False, tree_budget=9)
        start = ids.shape[1]
        split = first_divergence(plain.sequences[0, start:], ours[0, start:], torch.stack(plain.logits)[:, 0],
                                 torch.bfloat16)
        assert split is None or split.near_tie, (seed, split)
        accepted = max(accepted, stats.mean_accepted)
    assert accepted > 1.0  # drafts were verified and accepted, not only lone roots


def test_static_steps_run_at_the_fixed_widths_only():
    model = make_tiny_llama()
    tree_model = TreeModel(model)
    tree_model.use_static(StaticSteps(static_widths(33)))
    tree_model.reserve = 40
    ids, mask = _repeating_batch(0, rows=2, pads=(0, 4))
    tree_model.prefill(ids, mask)
    assert tree_model.pools[0].capacity % CAPACITY_STEP == 0
    seen = []
    for sizes in ([1, 1], [2, 1], [5, 3], [9, 1], [33, 20]):
        trees = [_chain(7, [9] * (n - 1)) for n in sizes]
        logits = tree_model.score_trees(trees)
        seen.append(logits.shape[1])
        tree_model.keep([np.array([0]), np.array([0])])
    assert seen == [1, 4, 8, 16, 33]


def test_static_tree_logits_match_the_dynamic_forward():
    model = make_tiny_llama()
    ids, mask = _repeating_batch(1, rows=2, pads=(0, 6))
    trees = [_forked(5, [11, 12, 13], [40, 41]), _chain(6, [21, 22])]
    results = []
    for static in (None, StaticSteps()):
        tree_model = TreeModel(model)
        if static is not None:
            tree_model.use_static(static)
        tree_model.reserve = 16
        tree_model.prefill(ids, mask)
        logits = tree_model.score_trees(trees)
        results.append([logits[i, : tree.size] for i, tree in enumerate(trees)])
    for dynamic, static in zip(*results):
        torch.testing.assert_close(static, dynamic, rtol=1e-4, atol=1e-4)


def test_static_greedy_equals_plain_on_sliding_window_layers():
    model, kind = tiny_model("gemma3_text", window=8)
    assert kind != "none"
    ids, mask = _repeating_batch(2, rows=2, pads=(0, 5))
    ids = ids % model.config.vocab_size
    ids[mask == 0] = 0
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    ours = _ours(model, ids, mask, max_new_tokens=30, cache_implementation="static", adaptive_tree=False, tree_budget=9)
    assert torch.equal(ours, plain)


def test_static_rows_that_finish_early_leave_the_pool():
    model = make_tiny_llama()
    ids, mask = _repeating_batch(3)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    eos = int(plain[1, ids.shape[1] + 4])  # row 1 stops at its fifth new token (others may too)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    ours = _ours(model, ids, mask, max_new_tokens=30, eos_token_id=eos, cache_implementation="static",
                 adaptive_tree=False, tree_budget=9)
    assert (plain == 0).any()  # some row was padded after its end
    assert torch.equal(ours, plain)


def test_static_call_after_a_reused_prefix_equals_plain():
    model = make_tiny_llama()
    memory = PluginMemory(persist=False)
    ids, mask = _repeating_batch(4, rows=1)
    first = _ours(model, ids, mask, memory=memory, max_new_tokens=20, cache_implementation="static")
    assert _continued(model, memory, first, ids[:, :7]) > 0


def _continued(model, memory, earlier: torch.Tensor, extra: torch.Tensor) -> int:
    """A static call on ``earlier`` (an earlier call's prompt and answer) followed by ``extra``, asserted
    equal to plain greedy; returns the prompt tokens it reused."""
    later = torch.cat([earlier, extra], dim=1)
    stats = DecodeStats()
    ours = _ours(model, later, torch.ones_like(later), memory=memory, max_new_tokens=20,
                 cache_implementation="static", draft_stats=stats)
    assert torch.equal(ours, model.generate(later, max_new_tokens=20, do_sample=False))
    return stats.reused_tokens


def test_compiled_static_step_traces_as_one_graph_and_equals_plain():
    model = make_tiny_llama()
    memory = PluginMemory(persist=False)
    config = CompileConfig(backend="aot_eager", fullgraph=True)  # a graph break raises
    config._compile_all_devices = True  # HF's own switch to compile off CUDA
    graphs = []
    for seed in (5, 6):  # a second call with another prompt of the same length
        ids, mask = _repeating_batch(seed, rows=1)
        ours = _ours(model, ids, mask, memory=memory, max_new_tokens=24, cache_implementation="static",
                     compile_config=config, adaptive_tree=False, tree_budget=3)
        assert torch.equal(ours, model.generate(ids, max_new_tokens=24, do_sample=False))
        graphs.append(counters["stats"]["unique_graphs"])
    assert len(memory.model(model).compiled) == 1  # the second call reused the first call's compiled forward
    assert graphs[1] == graphs[0]  # ... and compiled no graph of its own


def test_compiling_follows_hfs_rule():
    config = CompileConfig()
    generation = type("Config", (), {"disable_compile": False, "compile_config": None})()
    assert compiles(torch.device("cuda"), generation)
    assert not compiles(torch.device("cpu"), generation)
    generation.compile_config = config
    config._compile_all_devices = True
    assert compiles(torch.device("cpu"), generation)
    generation.disable_compile = True
    assert not compiles(torch.device("cuda"), generation)


def test_widths_cover_the_budget_without_padding_a_full_tree():
    assert static_widths(33) == (1, 4, 8, 16, 32, 33)
    assert static_widths(4) == (1, 4)
    assert static_widths(1) == (1,)
    assert [padded_width(n, (1, 4, 8)) for n in (1, 2, 4, 5, 8)] == [1, 4, 4, 8, 8]
    with pytest.raises(InvalidInputError, match="wider than the widest"):
        padded_width(9, (1, 4, 8))
    with pytest.raises(InvalidInputError, match="increasing"):
        StaticSteps((4, 1))
    assert static_capacity(1) == CAPACITY_STEP and static_capacity(CAPACITY_STEP + 1) == 2 * CAPACITY_STEP


def test_the_planner_prices_a_tree_at_its_padded_width():
    cost = VerifyCost.from_points([1, 64], [1.0, 64.0])
    priced = stepped(cost, (1, 4, 8, 16, 32, 33))
    assert priced.max_nodes == 33
    assert [priced.seconds[n] for n in (1, 2, 4, 5, 9, 17, 33)] == [1.0, 4.0, 4.0, 8.0, 16.0, 32.0, 33.0]


def test_other_cache_implementations_are_refused_in_one_line(tiny_llama):
    ids = torch.randint(3, 300, (1, 8))
    with pytest.raises(InvalidInputError, match="cache_implementation='offloaded' is not supported") as caught:
        tiny_llama.generate(ids, max_new_tokens=4, custom_generate=retrieval_draft.generate,
                            cache_implementation="offloaded")
    assert "\n" not in str(caught.value)


def test_static_is_refused_for_a_model_verified_as_chains():
    model, _ = tiny_model("bloom")  # ALiBi position biases: chains, the model's own masking
    ids = torch.randint(3, model.config.vocab_size, (1, 8))
    with pytest.raises(UnsupportedModelError, match="cache_implementation='static' is not supported") as caught:
        model.generate(ids, max_new_tokens=4, custom_generate=retrieval_draft.generate, cache_implementation="static")
    assert "\n" not in str(caught.value)


def test_calls_of_one_shape_reuse_the_pool_tensors():
    model = make_tiny_llama()
    memory = PluginMemory(persist=False)
    addresses = []
    for seed in (6, 7):
        ids, mask = _repeating_batch(seed, rows=1)
        ours = _ours(model, ids, mask, memory=memory, max_new_tokens=20, cache_implementation="static",
                     prefix_cache_bytes=0)
        assert torch.equal(ours, model.generate(ids, max_new_tokens=20, do_sample=False))
        addresses.append(memory.model(model).slab.take("keys", *_held(memory, model)).data_ptr())
    assert addresses[0] == addresses[1]


def _held(memory, model) -> tuple:
    """The (shape, dtype, device) of the slab's held keys."""
    key, _ = memory.model(model).slab._held["keys"]
    return key


def test_rows_kept_for_later_calls_survive_the_next_call_taking_the_pool():
    model = make_tiny_llama()
    memory = PluginMemory(persist=False)
    first = torch.randint(3, 300, (1, 200), generator=torch.Generator().manual_seed(8))
    other = torch.randint(3, 300, (1, 200), generator=torch.Generator().manual_seed(9))
    kept = _ours(model, first, torch.ones_like(first), memory=memory, max_new_tokens=20, cache_implementation="static")
    _ours(model, other, torch.ones_like(other), memory=memory, max_new_tokens=20, cache_implementation="static")
    assert _continued(model, memory, kept, first[:, :3]) > 200  # the first call's prompt and answer, reused


def test_a_model_compiled_in_place_is_refused_in_one_line():
    model = make_tiny_llama()
    model.compile()
    ids = torch.randint(3, 300, (1, 8))
    with pytest.raises(InvalidInputError, match="compiled in place") as caught:
        model.generate(ids, max_new_tokens=4, custom_generate=retrieval_draft.generate)
    assert "\n" not in str(caught.value)


def test_static_forward_times_correct_the_curve_apart_from_the_default_path():
    model = make_tiny_llama()
    memory = PluginMemory(persist=False)
    ids, mask = _repeating_batch(10, rows=1)
    _ours(model, ids, mask, memory=memory, max_new_tokens=24, cache_implementation="static")
    learned = memory.model(model)
    assert learned.static_observed.forwards > 0
    assert learned.observed.forwards == 0  # what the kept curve may be lowered by saw nothing of it
