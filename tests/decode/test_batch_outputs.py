"""A batch gets what one row gets: per-row streaming, HF's batched scores and logits, and
logits processors with per-row state (repetition penalty, prefix constraints) as HF's batched
``generate`` applies them."""

from __future__ import annotations

import pytest
import torch

from tests.decode.test_batch_greedy import hf, mixed_batch, ours


class Recording:
    """An HF streamer (``put``/``end``) that keeps every call: ("put", ids as a list) or ("end",)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls.append(("put", value.reshape(-1).tolist()))

    def end(self) -> None:
        self.calls.append(("end",))


def _new_tokens(sequences: torch.Tensor, ids: torch.Tensor, row: int, eos: int | None) -> list[int]:
    """Row ``row``'s new tokens in a (B, L + m) output, without the padding after its EOS."""
    tail = sequences[row, ids.shape[1] :].tolist()
    return tail[: tail.index(eos) + 1] if eos is not None and eos in tail else tail


@pytest.mark.parametrize("processing", [{}, {"repetition_penalty": 1.3, "min_new_tokens": 3}])
def test_batch_scores_and_logits_equal_hfs_batched_ones_while_each_row_runs(tiny_llama, processing):
    ids, mask = mixed_batch(7, 3)
    free = hf(tiny_llama, ids, mask, 16, eos_token_id=[], **processing)
    eos = int(free[0, ids.shape[1] + 5])  # row 0 stops after 6 tokens, the others later or never
    asked = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, eos_token_id=eos, **processing)
    expected = hf(tiny_llama, ids, mask, 16, **asked)
    got = ours(tiny_llama, ids, mask, 16, **asked)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores) and len(got.logits) == len(expected.logits)
    lengths = [len(_new_tokens(expected.sequences, ids, row, eos)) for row in range(ids.shape[0])]
    assert min(lengths) < max(lengths)  # some row stopped before another
    for step, (ours_s, hf_s, ours_l, hf_l) in enumerate(zip(got.scores, expected.scores, got.logits, expected.logits)):
        assert ours_s.shape == hf_s.shape == (ids.shape[0], tiny_llama.config.vocab_size)
        for row, length in enumerate(lengths):
            if step < length:
                assert torch.allclose(ours_l[row], hf_l[row], atol=1e-4), (step, row)
                finite = torch.isfinite(hf_s[row])
                assert torch.equal(finite, torch.isfinite(ours_s[row])), (step, row)
                assert torch.allclose(ours_s[row][finite], hf_s[row][finite], atol=1e-4), (step, row)
            else:  # after the row stopped: HF scores its padding, which no tree computes
                assert torch.isnan(ours_s[row]).all() and torch.isnan(ours_l[row]).all()


def test_repetition_penalty_on_a_padded_batch_equals_hfs_batched_greedy(tiny_llama):
    ids, mask = mixed_batch(3, 4)
    expected = hf(tiny_llama, ids, mask, 20, repetition_penalty=1.5)
    assert not torch.equal(expected, hf(tiny_llama, ids, mask, 20))  # the penalty changes the output
    got = ours(tiny_llama, ids, mask, 20, repetition_penalty=1.5)
    assert torch.equal(got, expected)


def test_prefix_constraints_see_each_rows_own_index(tiny_llama):
    ids, mask = mixed_batch(4, 3)

    def allowed(batch_id: int, sequence: torch.Tensor) -> list[int]:
        return list(range(10 + 20 * batch_id, 30 + 20 * batch_id))  # row b draws from its own 20 ids

    expected = hf(tiny_llama, ids, mask, 12, prefix_allowed_tokens_fn=allowed)
    got = ours(tiny_llama, ids, mask, 12, prefix_allowed_tokens_fn=allowed)
    assert torch.equal(got, expected)
    for row in range(ids.shape[0]):
        assert all(10 + 20 * row <= t < 30 + 20 * row for t in got[row, ids.shape[1] :].tolist())


def test_each_rows_streamer_receives_its_prompt_then_its_new_tokens_then_end(tiny_llama):
    ids, mask = mixed_batch(7, 3)
    free = hf(tiny_llama, ids, mask, 16, eos_token_id=[])
    eos = int(free[0, ids.shape[1] + 4])
    streamers = [Recording() for _ in range(ids.shape[0])]
    got = ours(tiny_llama, ids, mask, 16, eos_token_id=eos, draft_streamer=streamers)
    assert torch.equal(got, hf(tiny_llama, ids, mask, 16, eos_token_id=eos))
    for row, streamer in enumerate(streamers):
        assert streamer.calls[0] == ("put", ids[row, mask[row].bool()].tolist())  # the prompt, no padding
        assert streamer.calls[-1] == ("end",)
        streamed = [token for call in streamer.calls[1:-1] for token in call[1]]
        assert streamed == _new_tokens(got, ids, row, eos)
