"""Our vLLM proposer drafts one chain per request from vLLM-shaped inputs, without vLLM installed.

vLLM (0.32) calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``: B lists of
the tokens each request just gained, an int32 array of each row's token count, and an int32 array
of shape (max_num_seqs, max_model_len) holding each row's tokens. The stand-ins below are those.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from retrieval_draft.draft import Draft, Drafter
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.integrations.request_chains import RequestChains, best_path
from retrieval_draft.integrations.step_cost import (
    ChainCorrection, CostShape, StepClock, StepCost, choose_lengths,
)
from retrieval_draft.integrations.vllm_proposer import (
    ENV_DATASTORE, ENV_DRAFTERS, ENV_MIN_PROB, ENV_STEP_COST, ProposerSettings, RetrievalDraftProposer,
)
from retrieval_draft.tree import DraftTree

K = 4
MAX_MODEL_LEN = 96
MAX_SEQS = 16
VOCAB = 320
BLOCK = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def vllm_config(k: int = K, max_model_len: int = MAX_MODEL_LEN):
    """The attributes of vLLM's ``VllmConfig`` the proposer reads."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: VOCAB))


class Batch:
    """vLLM's persistent batch as the proposer sees it: rows of tokens and their counts."""

    def __init__(self, max_model_len: int = MAX_MODEL_LEN) -> None:
        self.token_ids_cpu = np.zeros((MAX_SEQS, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(MAX_SEQS, dtype=np.int32)
        self.rows: list[list[int]] = []

    def set(self, rows: list[list[int]]) -> None:
        """Lay ``rows`` (each a request's tokens) into the arrays, row i at index i."""
        self.token_ids_cpu[:] = 0
        self.num_tokens_no_spec[:] = 0
        for i, tokens in enumerate(rows):
            self.token_ids_cpu[i, : len(tokens)] = tokens
            self.num_tokens_no_spec[i] = len(tokens)
        self.rows = [list(tokens) for tokens in rows]

    def step(self, proposer, gained: list[list[int]]) -> list[list[int]]:
        """Append ``gained[i]`` to row i, then ask the proposer."""
        self.set([tokens + new for tokens, new in zip(self.rows, gained)])
        return proposer.propose(gained, self.num_tokens_no_spec, self.token_ids_cpu)


def proposer(min_prob: float = 0.0, drafters=("prompt", "history"), step_cost=None, **config) -> RetrievalDraftProposer:
    """Chains sent whole unless ``step_cost`` (a ``CostShape``) sizes them."""
    settings = ProposerSettings(drafters=drafters, min_prob=min_prob, step_cost=step_cost)
    return RetrievalDraftProposer(vllm_config(**config), settings)


def first_step(proposer_, prompts: list[list[int]], first_tokens: list[int]) -> list[list[int]]:
    """The step after prefill: each prompt gained its first token."""
    batch = Batch()
    batch.set(prompts)
    return batch.step(proposer_, [[token] for token in first_tokens]), batch


def test_it_proposes_the_continuation_of_a_repeated_block():
    drafts, _ = first_step(proposer(), [BLOCK + [40, 41] + BLOCK[:2]], [BLOCK[2]])
    assert drafts == [BLOCK[3: 3 + K]]


def test_it_proposes_at_most_num_speculative_tokens():
    for k in (1, 2, 7):
        drafts, _ = first_step(proposer(k=k), [BLOCK * 3 + BLOCK[:2]], [BLOCK[2]])
        assert drafts[0] == BLOCK[3: 3 + k]


def test_nothing_matching_gives_an_empty_list():
    drafts, _ = first_step(proposer(), [list(range(100, 120))], [121])
    assert drafts == [[]]


def test_a_batch_gets_one_list_per_request_and_none_for_rows_still_prefilling():
    prompts = [BLOCK + [50 + i] + BLOCK[:2] if i % 2 == 0 else list(range(100 + i, 110 + i)) for i in range(12)]
    batch = Batch()
    batch.set(prompts)
    gained = [[BLOCK[2]] if i % 2 == 0 else [200 + i] for i in range(11)] + [[]]  # the last row is mid-prefill
    drafts = batch.step(proposer(), gained)
    assert len(drafts) == 12
    assert all(draft == BLOCK[3: 3 + K] for draft in drafts[0:11:2])
    assert all(draft == [] for draft in drafts[1::2])


def test_drafts_stop_at_the_model_length():
    prompt = BLOCK * 2 + BLOCK[:2]
    drafts, _ = first_step(proposer(max_model_len=len(prompt) + 3), [prompt], [BLOCK[2]])
    assert drafts == [BLOCK[3:4]]  # 23 tokens held, room for one draft and the bonus token


def test_a_high_min_prob_cuts_the_chain():
    drafts, _ = first_step(proposer(min_prob=1.0), [BLOCK + [40] + BLOCK[:2]], [BLOCK[2]])
    assert drafts == [[]]


def test_steps_grade_the_drafts_against_the_tokens_gained():
    proposer_ = proposer()
    drafts, batch = first_step(proposer_, [BLOCK + [40] + BLOCK[:2]], [BLOCK[2]])
    calibrator = proposer_.chains.grader.calibrators["prompt"]
    before = calibrator.trials.sum()
    batch.step(proposer_, [drafts[0][:2] + [99]])  # two drafts accepted, then a bonus token
    assert calibrator.trials.sum() > before * calibrator.decay


def test_a_finished_request_feeds_the_output_history_and_moved_requests_keep_their_state():
    proposer_ = proposer()
    answer = list(range(60, 72))
    batch = Batch()
    batch.set([[1, 2, 3], [7, 8, 9]])
    batch.step(proposer_, [[answer[0]], [30]])
    for token in answer[1:]:  # request 0 writes its answer, request 1 a run of its own
        batch.step(proposer_, [[token], [31]])
    assert proposer_.chains.live == 2
    # request 0 ends; vLLM moves request 1 into row 0
    batch.set([batch.rows[1]])
    batch.step(proposer_, [[32]])
    assert proposer_.chains.live == 2  # request 0 parked: it may only be off this step
    for _ in range(proposer_.chains.grace):
        batch.step(proposer_, [[33]])
    assert proposer_.chains.live == 1
    # a new request whose context starts like request 0's answer: the history drafts the rest
    new = Batch()
    new.set([batch.rows[0], [5, 5] + answer[:3]])
    drafts = new.step(proposer_, [[34], [answer[3]]])
    assert drafts[1] == answer[4: 4 + K]


def test_a_next_turn_that_extends_a_finished_request_is_a_new_request():
    proposer_ = proposer()
    batch = Batch()
    batch.set([BLOCK + [40]])
    batch.step(proposer_, [[41]])
    first = proposer_.chains._requests[0]
    batch.set([batch.rows[0] + [42, 43, 44]])  # the same row now holds the conversation's next turn
    batch.step(proposer_, [[45]])
    assert proposer_.chains._requests[0] is not first


def test_the_chain_is_the_path_expected_to_have_most_tokens_accepted():
    # root -> A (0.5, a leaf); root -> B (0.45) -> C (0.4) -> D (0.36)
    tree = DraftTree(np.array([0, 1, 2, 3, 4]), np.array([-1, 0, 0, 2, 3]), np.array([0, 1, 1, 2, 3]),
                     np.array([1.0, 0.5, 0.45, 0.4, 0.36]))
    assert best_path(tree, 3).tolist() == [2, 3, 4]  # 1.21 tokens expected against A's 0.5
    assert best_path(tree, 1).tolist() == [1]  # one token: A is the likelier
    assert best_path(tree, 0).tolist() == []
    lone = DraftTree(np.array([0]), np.array([-1]), np.array([0]), np.array([1.0]))
    assert best_path(lone, 4).tolist() == []


def test_settings_come_from_the_environment(tmp_path):
    settings = ProposerSettings.from_env({ENV_DATASTORE: os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]),
                                          ENV_DRAFTERS: "prompt, history", ENV_MIN_PROB: "0.25"})
    assert settings.datastores == (str(tmp_path / "a"), str(tmp_path / "b"))
    assert settings.drafters == ("prompt", "history") and settings.min_prob == 0.25
    assert ProposerSettings.from_env({}) == ProposerSettings()
    assert ProposerSettings().step_cost == CostShape()
    assert ProposerSettings.from_env({ENV_STEP_COST: "off"}).step_cost is None
    assert ProposerSettings.from_env({ENV_STEP_COST: "0.2, 0.01"}).step_cost == CostShape(0.2, 0.01)
    for bad in ("x", "2"):
        with pytest.raises(InvalidInputError):
            ProposerSettings.from_env({ENV_MIN_PROB: bad})
    for bad in ("x", "0.1", "-1,0.1"):
        with pytest.raises(InvalidInputError):
            ProposerSettings.from_env({ENV_STEP_COST: bad})


def test_a_datastore_drafts_for_the_requests(tmp_path):
    from retrieval_draft_datastore.builder import build
    from tests.datastore_fixtures import word_tokenizer

    words = "a b c d e f g h".split()
    tokenizer = word_tokenizer(words)
    (tmp_path / "doc.txt").write_text("a b c d e f g h " * 3)
    build([str(tmp_path / "doc.txt")], tmp_path / "store", tokenizer, progress=False)
    settings = ProposerSettings(datastores=(str(tmp_path / "store"),), min_prob=0.0, step_cost=None)
    proposer_ = RetrievalDraftProposer(vllm_config(), settings, tokenizer=tokenizer)
    chains = proposer_.chains
    assert [drafter.name for drafter in chains.drafters[: chains.fallbacks_from]] == ["prompt", "history"]
    assert [drafter.name for drafter in chains.drafters[chains.fallbacks_from:]] == ["ngram", "suffix"]  # the fallbacks
    ids = tokenizer("h a b")["input_ids"]
    drafts, _ = first_step(proposer_, [ids], [tokenizer.convert_tokens_to_ids("c")])
    assert tokenizer.convert_ids_to_tokens(drafts[0]) == ["d", "e", "f", "g"]  # the request's own text has none


class CountingDrafter(Drafter):
    """Always drafts ``tokens``; counts the calls."""

    def __init__(self, name: str, tokens: list[int]) -> None:
        self.name, self.tokens, self.calls = name, tokens, 0

    def propose(self, context, max_len):
        self.calls += 1
        return [Draft(np.array(self.tokens[:max_len]), np.full(min(len(self.tokens), max_len), 0.99))]


def test_fallback_drafters_are_asked_only_where_the_requests_own_drafters_give_nothing():
    store = CountingDrafter("store", [90, 91, 92, 93])
    chains = RequestChains([PromptLookupDrafter()], K, MAX_MODEL_LEN, fallbacks=[store])
    batch = Batch()
    batch.set([BLOCK + [50, 51] + BLOCK[:2]])  # the request's own text continues its block
    assert batch.step(chains, [[BLOCK[2]]]) == [BLOCK[3:7]]
    assert store.calls == 0  # prompt lookup drafted: the store was not asked
    assert batch.step(chains, [[77]]) == [[90, 91, 92, 93]]  # nothing of its own follows 77
    assert store.calls == 1


def test_the_proposer_imports_no_vllm_and_the_core_never_imports_it():
    runtime = Path(__file__).resolve().parents[2] / "retrieval_draft"
    for path in runtime.rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        assert not {name for name in names if name.split(".")[0] == "vllm"}, path
        if "integrations" not in path.parts:
            assert not {name for name in names if name.startswith("retrieval_draft.integrations")}, path


# The chain chooser: how much of each request's chain to send, by expected gain against step cost.

SHAPE = CostShape(overhead=0.05, per_token=0.08)


def test_a_long_likely_chain_is_sent_whole():
    assert choose_lengths([np.full(8, 0.9)], SHAPE) == [8]
    # each further token is worth its cost while its path probability beats the step's rate x its cost
    assert choose_lengths([0.9 ** np.arange(1, 9)], SHAPE) == [8]


def test_a_weak_draft_is_not_sent_at_all():
    assert choose_lengths([np.array([0.05, 0.02])], SHAPE) == [0]
    # worth sending on a free engine, not where a speculative step has an overhead
    assert choose_lengths([np.array([0.1])], CostShape(0.0, 0.0)) == [1]
    assert choose_lengths([np.array([0.1])], CostShape(0.2, 0.0)) == [0]


def test_a_chain_is_cut_where_its_tokens_stop_paying():
    probs = np.array([0.9, 0.8, 0.7, 0.1, 0.05, 0.02])
    assert choose_lengths([probs], SHAPE) == [3]
    assert choose_lengths([probs], CostShape(0.05, 0.001)) == [6]  # nearly free tokens: all of them
    assert choose_lengths([np.zeros(0)], SHAPE) == [0]
    assert choose_lengths([], SHAPE) == []


def test_a_batch_shares_one_step_so_a_weak_row_rides_only_on_strong_ones():
    weak, strong = np.array([0.3]), np.full(6, 0.9)
    assert choose_lengths([weak], CostShape(0.4, 0.05)) == [0]  # alone, 0.3 tokens do not pay the overhead
    lengths = choose_lengths([weak, strong], CostShape(0.4, 0.05))
    assert lengths == [1, 6]  # the overhead is paid anyway: the weak row's token costs only its own
    # over a batch the step's rate is higher, so each token must carry more
    assert choose_lengths([np.array([0.9, 0.15])], SHAPE) == [2]
    assert choose_lengths([np.array([0.9, 0.15])] + [np.full(4, 0.95)] * 7, SHAPE)[0] == 1


def test_the_step_cost_learns_the_engine_from_its_steps():
    cost = StepCost(CostShape(0.2, 0.02))
    assert cost.relative() == CostShape(0.2, 0.02)  # the prior before any step
    rng = np.random.default_rng(0)
    for step in range(400):
        n = int(rng.integers(0, 9))
        cost.observe(0.080 + 0.004 * (n > 0) + 0.006 * n + rng.normal(0, 0.001), n)
    plain, overhead, per_token = cost.coefficients()
    assert plain == pytest.approx(0.080, rel=0.05) and per_token == pytest.approx(0.006, rel=0.15)
    assert abs(overhead - 0.004) < 0.003
    assert cost.relative().per_token == pytest.approx(0.075, rel=0.15)


def test_a_step_cost_that_never_sees_drafts_keeps_its_prior_shape():
    cost = StepCost(CostShape(0.1, 0.05))
    for _ in range(200):
        cost.observe(0.09, 0)
    plain, _, _ = cost.coefficients()
    assert abs(plain - 0.09) < 1e-6
    learned = cost.relative()
    assert learned.overhead == pytest.approx(0.1) and learned.per_token == pytest.approx(0.05)


def test_the_clock_samples_only_steps_between_calls_over_the_same_requests():
    now = iter([0.0, 0.01, 0.1, 0.11, 0.2, 0.21, 0.3]).__next__
    clock = StepClock(clock=now)
    clock.start()
    assert clock.sample(1, [1]) is None  # no call before
    clock.sent(1, 5)
    clock.start()
    assert clock.sample(1, [3]) == pytest.approx((0.09, 5))
    clock.sent(1, 0)
    clock.start()
    assert clock.sample(2, [1, 1]) is None  # a request came
    clock.sent(2, 0)
    clock.start()
    assert clock.sample(2, [1, 0]) is None  # a row still prefilling


def test_the_proposer_learns_the_step_cost_from_the_pace_of_its_calls():
    proposer_ = proposer(step_cost=CostShape())
    drafts, batch = first_step(proposer_, [BLOCK * 3 + BLOCK[:2]], [BLOCK[2]])
    assert proposer_.chains.cost.samples == 0  # the first decoding step after a prompt is no sample
    for _ in range(3):
        drafts = batch.step(proposer_, [drafts[0] + [BLOCK[(BLOCK.index(drafts[0][-1]) + 1) % 10]] if drafts[0] else [BLOCK[0]]])
    assert proposer_.chains.cost.samples > 0


def test_with_a_step_cost_a_repeated_block_is_still_drafted_and_noise_is_not():
    proposer_ = proposer(step_cost=CostShape())
    drafts, _ = first_step(proposer_, [BLOCK * 3 + BLOCK[:2], list(range(100, 120))], [BLOCK[2], 121])
    assert drafts[0] == BLOCK[3: 3 + K] and drafts[1] == []


def test_chains_that_deliver_less_than_promised_are_scaled_down_and_then_sent_shorter():
    correction = ChainCorrection()
    probs = np.array([0.9, 0.8, 0.7, 0.6])
    assert correction.scale(probs) == pytest.approx(probs)  # no chain sent yet: believed as given
    for _ in range(100):
        correction.record(probs, accepted=1)  # the first token is accepted, never the rest
    scaled = correction.scale(probs)
    assert scaled[0] > 0.95 and scaled[1] <= 0.2 and np.all(np.diff(scaled) <= 0)  # the first: accepted more than promised
    assert choose_lengths([probs], SHAPE) == [4]
    assert choose_lengths([scaled], SHAPE) == [1]


def test_the_proposer_records_what_its_chains_delivered():
    proposer_ = proposer(step_cost=CostShape())
    drafts, batch = first_step(proposer_, [BLOCK * 3 + BLOCK[:2]], [BLOCK[2]])
    assert drafts[0] == BLOCK[3: 3 + K]
    batch.step(proposer_, [drafts[0][:1] + [99]])  # one accepted, then the model's own token
    correction = proposer_.chains.correction.ranks
    assert correction.promised[:2].sum() > 0 and correction.delivered[0] == pytest.approx(1.0)
    assert correction.delivered[1:].sum() == 0
