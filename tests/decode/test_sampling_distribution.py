"""Sampling is lossless: our sampler's output follows the model's distribution exactly.

A tiny Llama with an 8-token vocabulary makes the exact distribution of the
next few tokens computable by enumeration: run the model (plain forward
passes, no tree, no cache) on every prefix, apply the logits processors HF
sampling applies, multiply the conditionals. Against it we compare

* ``verify_sampling`` alone: 50,000 draws of the next two tokens per setting
  (temperature 1, or temperature 0.7 + top-p 0.9) and per kind of drafts
  (oracle, random, adversarial). With deterministic drafts the tree of a
  context is fixed, so its logits are scored once (through ``TreeModel``, as
  the engine does) and only the sampler walk is repeated; and
* the whole engine (``speculative_decode``: prefill, depth-2 tree steps,
  cache compaction, processors that read each node's prefix): 3,000
  generations of four tokens, run as batches of 50 rows of the same prompt.
  Each row samples from its own stream (seeded from the call's generator,
  ``engine._row_generator``, as a batch of one does), so the rows of a batch
  are independent generations; batching only shares the forward passes.

Each check asserts that the total variation distance (TV) between the
empirical and the exact distribution stays under the bound of ``tv_bound``.
A negative control, a sampler that re-samples from p instead of the residual
after a rejection (REST's rule), goes through the very same harness and must
exceed the bound computed for its own number of draws, which shows the checks
see a biased sampler: 50,000 draws with random drafts (its TV 0.03-0.06 against
bounds of 0.02-0.03), 10,000 with oracle and adversarial drafts (TV about 0.2,
bound 0.06 at that count), 1,000 runs in the engine check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import retrieval_draft.decode.verify as readout
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.tree import DraftTree, build_tree
from retrieval_draft.decode.verify import Verdict, node_scores, verify_sampling
from retrieval_draft.draft import Draft, Drafter
from retrieval_draft.drafters.recycling import RecyclingDrafter
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.model.tree_model import TreeModel

VOCAB = 8
CONTEXT = (3, 6, 1, 7, 4, 5, 3, 0)  # prompt of the sampler-only checks; its last token is the tree root
SAMPLES = 50_000  # sampler-only draws per setting
CONTROL_SAMPLES = {"oracle": 10_000, "random": SAMPLES, "adversarial": 10_000}  # the control's, by kind of drafts
ENGINE_RUNS = 3_000  # whole generations in the engine check
ENGINE_CONTROL_RUNS = 1_000
ENGINE_BATCH = 50  # generations per engine call (rows of one batch); divides both counts
DELTA = 1e-6  # failure probability allowed to one correct check


# ----------------------------------------------------------------------------- statistics


def tv_bound(exact: np.ndarray, n: int, delta: float = DELTA) -> float:
    """Bound that the TV of an empirical distribution from ``n`` iid draws stays under with probability >= 1 - delta.

    Let p be the exact distribution over K outcomes and p_hat the empirical
    one from n iid draws, TV = 1/2 sum_i |p_hat_i - p_i|.

    Mean: n * p_hat_i is Binomial(n, p_i), so by Jensen
    E|p_hat_i - p_i| <= sqrt(Var p_hat_i) = sqrt(p_i (1 - p_i) / n), hence
    E[TV] <= 1/2 sum_i sqrt(p_i (1 - p_i) / n)  (<= 1/2 sqrt(K / n) by Cauchy-Schwarz).

    Deviation: TV is a function of the n independent draws, and changing one
    draw moves mass 1/n from one outcome to another, changing TV by at most
    1/n. McDiarmid's inequality gives P(TV >= E[TV] + t) <= exp(-2 n t^2);
    t = sqrt(ln(1/delta) / (2 n)) makes that delta.

    So TV <= 1/2 sum_i sqrt(p_i (1 - p_i) / n) + sqrt(ln(1/delta) / (2 n))
    except with probability delta. The exact p here comes from full forward
    passes while the samplers see tree-scored logits; the two differ by float
    rounding (~1e-6 in probability), far below the bound's ~1e-2.
    """
    exact = np.asarray(exact, dtype=np.float64)
    mean_bound = 0.5 * float(np.sum(np.sqrt(exact * (1.0 - exact) / n)))
    return mean_bound + math.sqrt(math.log(1.0 / delta) / (2.0 * n))


def empirical_tv(outcomes: np.ndarray, exact: np.ndarray) -> float:
    """TV between the empirical distribution of ``outcomes`` (shape (n,), ints) and ``exact`` (shape (K,))."""
    counts = np.bincount(outcomes, minlength=exact.shape[0])
    assert counts.shape == exact.shape, "an outcome outside the enumerated support"
    return 0.5 * float(np.abs(counts / outcomes.shape[0] - exact).sum())


def encode(sequences: np.ndarray) -> np.ndarray:
    """Rows of H token ids -> outcome index in [0, VOCAB**H) (first token most significant)."""
    index = np.zeros(sequences.shape[0], dtype=np.int64)
    for column in sequences.T:
        index = index * VOCAB + column
    return index


# ----------------------------------------------------------------------------- model and exact distribution


def make_model() -> torch.nn.Module:
    """A one-layer random Llama like conftest's, with an 8-token vocabulary.

    Rescaled so that the next-token distribution is neither near uniform nor
    near deterministic (entropy ~1.3-1.9 nats of a possible 2.08, favourite
    token ~0.25-0.6) and depends on more than the last token (sharper
    attention); at CONTEXT, temperature 0.7 + top-p 0.9 still leaves 5
    tokens to choose from and 23 possible two-token continuations.
    """
    torch.manual_seed(14)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(3.0)
            layer.self_attn.k_proj.weight.mul_(3.0)
            layer.self_attn.v_proj.weight.mul_(5.0)
            layer.self_attn.o_proj.weight.mul_(5.0)
    return model


def processed_probs(processor, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """What HF sampling draws from: softmax of the processed scores. ids (B, L), logits (B, V) -> (B, V) float64."""
    scores = logits.float().clone()
    if processor:
        scores = processor(ids, scores)
    return torch.softmax(scores, dim=-1).double()


@torch.no_grad()
def exact_conditionals(model, context: tuple[int, ...], horizon: int, processor) -> list[np.ndarray]:
    """Next-token distributions after every prefix of the horizon, by enumeration.

    Entry d has shape (VOCAB,) * (d + 1): ``[t1, ..., td, :]`` is the
    distribution of token d + 1 after context + (t1, ..., td). All VOCAB**(horizon-1)
    continuations go through one plain (untreed, uncached) forward pass.
    """
    tails = np.array(np.meshgrid(*[np.arange(VOCAB)] * (horizon - 1), indexing="ij")).reshape(horizon - 1, -1).T
    ids = torch.cat([torch.tensor(context).expand(tails.shape[0], -1), torch.from_numpy(tails)], dim=1)
    logits = model(ids).logits
    length = len(context)
    out = []
    for depth in range(horizon):
        probs = processed_probs(processor, ids[:, : length + depth], logits[:, length + depth - 1])
        # rows sharing the first `depth` tail tokens are identical here; keep one of each
        probs = probs.reshape((VOCAB,) * (horizon - 1) + (VOCAB,))
        probs = probs[tuple([slice(None)] * depth + [0] * (horizon - 1 - depth))]
        out.append(probs.numpy())
    return out


def exact_joint(conditionals: list[np.ndarray]) -> np.ndarray:
    """Joint distribution of the next H tokens, flattened as ``encode`` numbers outcomes."""
    joint = conditionals[0]
    for cond in conditionals[1:]:
        joint = joint[..., None] * cond
    return joint.reshape(-1)


# ----------------------------------------------------------------------------- samplers


def resample_from_p(tree: DraftTree, logits, processor, prefix, generator=None) -> Verdict:
    """Negative control, REST's rule: at each node, try each child by drawing a fresh
    x ~ p and accepting the child when x equals it; when every child is rejected,
    draw the bonus from p again (not from the residual). Drafted tokens come out
    too often: a child with p(c) = 0.5 is emitted with probability 0.75."""
    children = tree.children()
    node, accepted = 0, []
    while True:
        probs = torch.softmax(node_scores(tree, logits, node, processor, prefix), dim=-1)
        cdf = torch.cumsum(probs, dim=0)
        kids = children[node]
        draws = torch.searchsorted(cdf, torch.rand(len(kids) + 1, generator=generator) * cdf[-1], right=True)
        draws = draws.clamp_(max=cdf.shape[0] - 1).tolist()
        for child, draw in zip(kids, draws):
            if draw == int(tree.tokens[child]):
                accepted.append(child)
                node = child
                break
        else:
            return Verdict(np.asarray(accepted, dtype=np.int64), draws[-1])


class MemoProcessor:
    """A logits processor list that remembers its answers: it is a pure function of
    (ids, scores), and the sampler-only checks ask the same few questions 50,000
    times. Answers are fresh copies, so a caller mutating them cannot poison the memo."""

    def __init__(self, processors: LogitsProcessorList) -> None:
        self.processors = processors
        self.memo: dict[tuple[bytes, bytes], torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.processors)

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        key = (ids.numpy().tobytes(), scores.numpy().tobytes())
        if key not in self.memo:
            self.memo[key] = self.processors(ids, scores.clone())
        return self.memo[key].clone()


# ----------------------------------------------------------------------------- sampler-only checks

SETTINGS = {
    "temperature_1": lambda: LogitsProcessorList(),
    "temperature_0.7_top_p_0.9": lambda: LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)]),
}
DRAFTS = ("oracle", "random", "adversarial")


def tree_from_levels(root: int, first: list[int], second: dict[int, list[int]]) -> DraftTree:
    """A two-level tree whose children are verified in exactly the listed order."""
    rank = lambda i: 0.95 - 0.1 * i  # noqa: E731 - decreasing draft probabilities keep the order
    drafts = []
    for i, a in enumerate(first):
        drafts.append(Draft(np.array([a]), np.array([rank(i)])))
        for j, b in enumerate(second.get(a, [])):
            drafts.append(Draft(np.array([a, b]), np.array([rank(i), rank(j)])))
    tree = build_tree(root, drafts, budget=64)
    kids = tree.children()
    assert tree.tokens[kids[0]].tolist() == first
    return tree


def rare_first(p: np.ndarray) -> list[int]:
    """Adversarial sibling order, worst first: the token the model picks least often
    (among those it can pick at all), then its runner-up, then its favourite. The
    likely tokens are reached only through the residual the rejections before them
    leave, so a residual that is not renormalised, or not used, shows."""
    ranked = [int(t) for t in np.argsort(-p, kind="stable") if p[t] > 0]
    return ranked[2:][-1:] + ranked[1:2] + ranked[:1]


def draft_trees(kind: str, conditionals: list[np.ndarray], root: int) -> list[DraftTree]:
    """Depth-2 trees rooted at ``root`` for the context the conditionals describe."""
    p1, p2 = conditionals[0], conditionals[1]
    if kind == "oracle":  # the most likely continuation
        a = int(np.argmax(p1))
        return [tree_from_levels(root, [a], {a: [int(np.argmax(p2[a]))]})]
    if kind == "random":  # several trees of uniformly random tokens, one picked per draw
        rng = np.random.default_rng(7)
        trees = []
        for _ in range(4):
            first = [int(t) for t in rng.permutation(VOCAB)[:3]]
            trees.append(tree_from_levels(root, first, {a: [int(t) for t in rng.permutation(VOCAB)[:2]] for a in first}))
        return trees
    first = rare_first(p1)
    return [tree_from_levels(root, first, {a: rare_first(p2[a]) for a in first})]


@dataclass
class Case:
    """Everything a sampler-only check needs: trees, their logits, and the exact answer."""

    trees: list[DraftTree]
    logits: list[torch.Tensor]
    processor: MemoProcessor
    prefix: torch.Tensor
    conditionals: list[np.ndarray]
    joint: np.ndarray


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def cases(model) -> dict[tuple[str, str], Case]:
    out = {}
    prefix = torch.tensor(CONTEXT)
    for setting, make_processor in SETTINGS.items():
        processor = make_processor()
        conditionals = exact_conditionals(model, CONTEXT, 2, processor)
        for kind in DRAFTS:
            trees = draft_trees(kind, conditionals, CONTEXT[-1])
            logits = []
            for tree in trees:
                scorer = TreeModel(model)
                scorer.prefill(prefix[None, :-1])
                logits.append(scorer.score_trees([tree])[0])
            out[setting, kind] = Case(trees, logits, MemoProcessor(processor), prefix, conditionals, exact_joint(conditionals))
    return out


def sample_pairs(sampler, case: Case, n: int, seed: int) -> np.ndarray:
    """n draws of the next two tokens, shape (n, 2).

    Each draw runs ``sampler`` once on a tree (random drafts: one of several,
    picked independently of the sampler's randomness) and takes the first two
    tokens of accepted path + bonus. When the root's children are all rejected
    that is one token; the second then comes from the model's exact next-token
    distribution, as any correct later step would give it. (The engine check
    covers real later steps.)
    """
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    which = rng.integers(len(case.trees), size=n)
    pairs = np.full((n, 2), -1, dtype=np.int64)
    for i in range(n):
        tree = case.trees[which[i]]
        verdict = sampler(tree, case.logits[which[i]], case.processor, case.prefix, generator)
        tokens = tree.tokens[verdict.accepted[:2]].tolist() + [verdict.bonus]
        pairs[i] = tokens[:2] if len(tokens) > 1 else (tokens[0], -1)
    short = pairs[:, 1] < 0
    cdf = np.cumsum(case.conditionals[1][pairs[short, 0]], axis=1)
    draws = (cdf <= rng.random(int(short.sum()))[:, None] * cdf[:, -1:]).sum(axis=1)
    pairs[short, 1] = np.minimum(draws, VOCAB - 1)
    return pairs


@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_verify_sampling_draws_match_the_exact_distribution(cases, setting, kind):
    case = cases[setting, kind]
    pairs = sample_pairs(verify_sampling, case, SAMPLES, seed=1)
    tv, bound = empirical_tv(encode(pairs), case.joint), tv_bound(case.joint, SAMPLES)
    print(f"verify_sampling {setting} {kind}: TV {tv:.4f} bound {bound:.4f}")
    assert tv < bound


@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_resampling_from_p_after_a_rejection_exceeds_the_bound(cases, setting, kind):
    case = cases[setting, kind]
    samples = CONTROL_SAMPLES[kind]
    pairs = sample_pairs(resample_from_p, case, samples, seed=1)
    tv, bound = empirical_tv(encode(pairs), case.joint), tv_bound(case.joint, samples)
    print(f"control {setting} {kind}: TV {tv:.4f} bound {bound:.4f}")
    assert tv > bound


# ----------------------------------------------------------------------------- whole-engine check

ENGINE_PROMPT = (3, 4, 3, 6, 3, 4)  # few distinct tokens: the repetition penalty changes as tokens are emitted
ENGINE_HORIZON = 4


def engine_processor() -> LogitsProcessorList:
    """What ``generate(do_sample=True, repetition_penalty=1.8, temperature=0.8, top_k=2)`` builds, in HF's order."""
    return LogitsProcessorList(
        [RepetitionPenaltyLogitsProcessor(1.8), TemperatureLogitsWarper(0.8), TopKLogitsWarper(2)]
    )


class KnowingDrafter(Drafter):
    """Drafts from the exact conditionals: the likeliest chain, the runner-up then the
    likeliest, and a random chain, tried in that order. Rejections, acceptances of a
    second sibling (non-contiguous cache compaction) and full acceptances all occur."""

    name = "knowing"

    def __init__(self, conditionals: list[np.ndarray], prompt_len: int, seed: int) -> None:
        self.conditionals = conditionals
        self.prompt_len = prompt_len
        self.rng = np.random.default_rng(seed)

    def _probs(self, tail: list[int]) -> np.ndarray | None:
        return self.conditionals[len(tail)][tuple(tail)] if len(tail) < len(self.conditionals) else None

    def _chain(self, tail: list[int], first: int, max_len: int) -> list[int]:
        chain = [first]
        while len(chain) < max_len and (probs := self._probs(tail + chain)) is not None:
            chain.append(int(np.argmax(probs)))
        return chain

    def propose(self, context, max_len):
        tail = context[self.prompt_len :].tolist()
        probs = self._probs(tail)
        if probs is None:
            return []
        ranked = np.argsort(-probs, kind="stable")
        drafts = [
            (self._chain(tail, int(ranked[0]), max_len), 0.9),
            (self._chain(tail, int(ranked[1]), max_len), 0.6),
            (self.rng.integers(0, VOCAB, size=max_len).tolist(), 0.3),
        ]
        return [Draft(np.array(tokens), np.full(len(tokens), prob)) for tokens, prob in drafts]


def engine_draws(model, runs: int, conditionals, menu: str = "knowing", steps: list | None = None) -> np.ndarray:
    """``runs`` generations of ENGINE_HORIZON tokens each, shape (runs, ENGINE_HORIZON), made by
    ``runs / ENGINE_BATCH`` engine calls on a batch of ENGINE_BATCH copies of the prompt.

    ``menu``: "knowing", "recycling" (a logits-recycling drafter whose table is
    kept across the calls, as the plugin keeps it across calls, and shared by the
    rows of a batch, as the plugin shares it) or both joined by "+". ``steps``,
    when given, collects each call's (tree steps, tokens from them).
    """
    assert runs % ENGINE_BATCH == 0
    prompt = torch.tensor([ENGINE_PROMPT] * ENGINE_BATCH)
    generator = torch.Generator().manual_seed(5)
    drafters = []
    if "knowing" in menu:
        drafters.append(KnowingDrafter(conditionals, len(ENGINE_PROMPT), seed=6))
    if "recycling" in menu:
        drafters.append(RecyclingDrafter(VOCAB, k=3, max_nodes=6))
    options = DecodeOptions(max_new_tokens=ENGINE_HORIZON, max_draft_len=2, do_sample=True)
    processor = engine_processor()
    out = np.empty((runs, ENGINE_HORIZON), dtype=np.int64)
    for start in range(0, runs, ENGINE_BATCH):
        planner = TreePlanner(tree_budget=8)
        outputs, stats = speculative_decode(
            TreeModel(model), prompt, [drafters] * ENGINE_BATCH, options, planner=planner, processor=processor,
            generator=generator,
        )
        out[start : start + ENGINE_BATCH] = np.stack(outputs)
        if steps is not None:
            steps.append((stats.steps, stats.step_tokens))
    return out


@pytest.fixture(scope="module")
def engine_conditionals(model):
    return exact_conditionals(model, ENGINE_PROMPT, ENGINE_HORIZON, engine_processor())


@pytest.mark.parametrize("menu", ["knowing", "recycling"])
def test_engine_sampling_matches_the_exact_distribution(model, engine_conditionals, menu):
    joint = exact_joint(engine_conditionals)
    steps: list[tuple[int, int]] = []
    draws = engine_draws(model, ENGINE_RUNS, engine_conditionals, menu, steps)
    tv, bound = empirical_tv(encode(draws), joint), tv_bound(joint, ENGINE_RUNS)
    accepted = sum(tokens for _, tokens in steps) / sum(count for count, _ in steps)
    print(f"engine ({menu}): TV {tv:.4f} bound {bound:.4f}, {accepted:.2f} tokens per tree step")
    assert accepted > 1.2, "the drafts must be accepted often enough to exercise the tree paths"
    assert tv < bound


def test_engine_with_resampling_from_p_exceeds_the_bound(model, engine_conditionals, monkeypatch):
    monkeypatch.setattr(readout, "verify_sampling", resample_from_p)
    joint = exact_joint(engine_conditionals)
    draws = engine_draws(model, ENGINE_CONTROL_RUNS, engine_conditionals)
    tv, bound = empirical_tv(encode(draws), joint), tv_bound(joint, ENGINE_CONTROL_RUNS)
    print(f"engine control: TV {tv:.4f} bound {bound:.4f}")
    assert tv > bound
