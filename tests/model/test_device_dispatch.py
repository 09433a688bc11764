"""Off the CPU: inputs on the model's device and dtype, no CPU-only kernel, event timing.

No GPU here: the ``meta`` device stands in for "not the CPU" (tensors with
shapes, dtypes and a device but no data), and ``torch.device('cuda')`` is
only handed to pure dispatch functions.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from retrieval_draft.decode import engine
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.tree import DraftTree, build_tree
from retrieval_draft.draft import Draft
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.planning import cost_probe, timing
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.planning.timing import CUDA_EVENTS, HOST_CLOCK, SYNCHRONIZED, ForwardTimer, timing_mode
from retrieval_draft.model.kv_cache import GrowingLayer
from retrieval_draft.model.row_slots import RowSlots
from retrieval_draft.model.skinny_linear import eligible_linears
from retrieval_draft.model.transfer import pack, to_device, unpack
from retrieval_draft.model.tree_model import TreeModel
from tests.conftest import make_tiny_llama, random_prompt

META = torch.device("meta")


def on_meta(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The same architecture with data-less weights on the meta device."""
    with torch.device(META):
        twin = type(model)(model.config)
    return twin.to(dtype).eval()


def tiny_gemma3() -> Gemma3ForCausalLM:
    config = Gemma3TextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], attn_implementation="sdpa",
    )
    return Gemma3ForCausalLM(config).eval()


def branching_tree() -> DraftTree:
    drafts = [Draft(np.array([5, 6, 7]), np.full(3, 0.9)), Draft(np.array([5, 8]), np.full(2, 0.5))]
    return build_tree(4, drafts, budget=8)


class CountCopies(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.copies += getattr(func, "__name__", "") in ("to", "cuda", "copy_")
        return func(*args, **(kwargs or {}))


def test_the_skinny_kernel_is_never_chosen_for_a_model_off_the_cpu(tiny_llama):
    assert eligible_linears(tiny_llama) and TreeModel(tiny_llama).skinny_sizes  # on CPU it is
    meta = on_meta(tiny_llama)
    assert eligible_linears(meta) == []
    assert TreeModel(meta).skinny_sizes == frozenset()


def after_prompt(tree_model: TreeModel, rows: int, length: int, gaps: bool = False) -> TreeModel:
    """``tree_model`` in the state a prefill of ``rows`` unpadded prompts of ``length`` tokens leaves
    (with ``gaps``: row 0 then hid its last two slots, as after a step another row won)."""
    visible = np.ones((rows, length), dtype=bool)
    if gaps:
        visible[0, -2:] = False
    tree_model.slots = RowSlots(visible, np.tile(np.arange(length), (rows, 1)))
    return tree_model


def inputs(tree_model: TreeModel, trees: list):
    """The forward's inputs for ``trees`` as ``score_trees`` packs them: tokens, position ids, mask."""
    packed = tree_model.pack(trees)
    return packed.tokens, packed.position_ids, packed.mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_inputs_are_built_on_the_models_device_in_its_dtype(tiny_llama, dtype):
    tree_model = after_prompt(TreeModel(on_meta(tiny_llama, dtype)), rows=1, length=10)
    with CountCopies() as counter:
        tokens, positions, mask = inputs(tree_model, [branching_tree()])
    assert counter.copies == 1  # one host -> device copy for ids, positions and the mask's tree part
    assert tokens.device == positions.device == mask.device == META
    assert tokens.dtype == positions.dtype == torch.int64 and mask.dtype == dtype
    assert mask.shape == (1, 1, 5, 15)


def test_sliding_window_masks_are_built_on_the_models_device(tiny_llama):
    tree_model = after_prompt(TreeModel(on_meta(tiny_gemma3(), torch.bfloat16)), rows=1, length=10)
    _, _, masks = inputs(tree_model, [branching_tree()])
    assert set(masks) == {"full_attention", "sliding_attention"}
    assert all(m.device == META and m.dtype == torch.bfloat16 and m.shape == (1, 1, 5, 15) for m in masks.values())


def test_a_bfloat16_tree_mask_blocks_with_the_dtypes_lowest_value():
    model = make_tiny_llama().to(torch.bfloat16)
    tree_model = TreeModel(model)
    tree_model.prefill(random_prompt(0, length=5))
    tree = branching_tree()
    _, _, mask = inputs(tree_model, [tree])
    expected = np.concatenate([np.ones((tree.size, 5), dtype=bool), tree.ancestor_mask()], axis=1)
    lowest = torch.finfo(torch.bfloat16).min
    assert mask.dtype == torch.bfloat16
    assert torch.equal(mask[0, 0] == 0, torch.from_numpy(expected))
    assert torch.all(mask[0, 0][~torch.from_numpy(expected)] == lowest)


@pytest.mark.parametrize("gaps", [False, True])
def test_batch_tree_inputs_are_built_on_the_models_device_in_its_dtype(tiny_llama, gaps):
    batch = after_prompt(TreeModel(on_meta(tiny_gemma3(), torch.bfloat16)), rows=2, length=7, gaps=gaps)
    with CountCopies() as counter:
        tokens_t, positions_t, masks = inputs(batch, [branching_tree(), build_tree(3, [], 0)])
    assert counter.copies == 1
    assert tokens_t.device == positions_t.device == META
    assert all(m.device == META and m.dtype == torch.bfloat16 and m.shape == (2, 1, 5, 12) for m in masks.values())


def test_several_host_arrays_reach_another_device_in_one_copy():
    arrays = [np.arange(5, dtype=np.int64), np.eye(3, dtype=bool), np.ones((2, 3), dtype=np.float32)]
    with CountCopies() as counter:
        moved = to_device(arrays, META)
    assert counter.copies == 1
    assert [(t.device, t.dtype, tuple(t.shape)) for t in moved] == [
        (META, torch.int64, (5,)), (META, torch.bool, (3, 3)), (META, torch.float32, (2, 3))
    ]


def test_packed_arrays_unpack_to_the_same_values():
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 9, size=7), rng.random((3, 5)) < 0.5, rng.random((2, 2)).astype(np.float32),
              np.arange(3, dtype=np.int32), np.zeros((0, 4), dtype=np.int64)]
    buffer, layout = pack(arrays)
    for array, tensor in zip(arrays, unpack(torch.from_numpy(buffer), layout)):
        np.testing.assert_array_equal(tensor.numpy(), array)
        assert tensor.numpy().dtype == array.dtype


def test_the_in_place_kv_cache_allocates_on_the_device_of_the_states():
    layer = GrowingLayer()
    keys = torch.empty((1, 2, 3, 4), device=META, dtype=torch.bfloat16)
    layer.update(keys, keys.clone())
    assert layer.keys.device == META and layer.keys.dtype == torch.bfloat16  # views of the buffer
    assert layer.keys.shape == (1, 2, 3, 4)


def test_forward_timing_follows_the_device():
    assert timing_mode(torch.device("cpu")) == HOST_CLOCK
    assert timing_mode(torch.device("cuda")) == timing_mode(torch.device("cuda", 1)) == CUDA_EVENTS
    assert timing_mode(torch.device("mps")) == timing_mode(META) == SYNCHRONIZED


def test_the_cpu_timer_measures_the_interval_between_start_and_stop(monkeypatch):
    """Read against a stand-in clock: the interval is the clock's, whatever the machine's speed."""
    clock = iter([100.0, 100.25, 107.0])
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    timer = ForwardTimer(torch.device("cpu"))
    timer.start()
    timer.stop()
    assert timer.seconds() == 0.25
    assert timer.seconds() == 0.25  # reading it again reads no clock: time after stop is not counted
    assert next(clock) == 107.0


class FixedTimer:
    """A stand-in for ``ForwardTimer`` that reports 0.125 s for every forward."""

    devices: list = []

    def __init__(self, device) -> None:
        FixedTimer.devices.append(torch.device(device))

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def seconds(self) -> float:
        return 0.125


class RecordingPlanner(TreePlanner):
    def observe_forward(self, rows: int, tokens: int, seconds: float, cache_len: int = 0, plan=None) -> None:
        self.seen = getattr(self, "seen", []) + [seconds]
        super().observe_forward(rows, tokens, seconds, cache_len, plan)


def test_decoding_and_cost_measurement_time_forwards_with_the_device_timer(tiny_llama, monkeypatch):
    monkeypatch.setattr(engine, "ForwardTimer", FixedTimer)
    monkeypatch.setattr(cost_probe, "ForwardTimer", FixedTimer)
    planner = RecordingPlanner(tree_budget=8)
    options = DecodeOptions(max_new_tokens=12, eos_ids=frozenset())
    speculative_decode(TreeModel(tiny_llama), random_prompt(1, repeat=2), [[PromptLookupDrafter()]], options, planner=planner)
    assert planner.seen and set(planner.seen) == {0.125}
    rng = np.random.default_rng(0)
    tree_model = TreeModel(tiny_llama)
    tree_model.prefill(random_prompt(2))
    assert cost_probe.time_chain(tree_model, 4, rng, repeats=2) == 0.125
    assert set(FixedTimer.devices) == {torch.device("cpu")}
