"""Verification of a step's scored token trees, with one device -> host read for all of them.

Given the target model's logits at every tree node, walk down from the root and decide which
draft nodes the model accepts, plus one bonus token drawn from the model at the last accepted
node (``walk``, the one walk). No model or cache here.

Two ways to the same verdict: ``verify_greedy`` / ``verify_sampling`` compute each visited
node's pick as the walk gets there (one host read per node, free on CPU, and only the nodes
visited are processed); ``greedy_choices`` / ``sampling_choices`` compute every node's pick on
the device, and ``read_verdicts`` reads them, together with whatever tree-observing drafters
record (the recycling table's top-k over each tree's likeliest nodes, ``Drafter.tree_request``),
in ONE host read (``transfer.to_host``) before walking the trees and handing each drafter its
columns: on a GPU each read apart is a round trip that waits for the stream (on CPU, where they
are host arrays already, nothing is joined). ``verify_trees`` picks per tree: on
CPU, where a logits processor or sampling is involved, the lazy walk (``walks_on_host``); plain
greedy takes the one-read path on every device.

Row ``i`` of ``logits`` is the model's next-token distribution after node ``i``'s prefix (the
context up to the root, then the path to node ``i``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numba
import numpy as np
import torch

from retrieval_draft.draft import EMPTY_INT64, Drafter
from retrieval_draft.model import transfer
from retrieval_draft.model.transfer import to_host
from retrieval_draft.tree import DraftTree

# (input_ids of shape (1, L), scores of shape (1, V)) -> scores of shape (1, V);
# a transformers LogitsProcessorList fits.
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification.

    Attributes:
        accepted: shape (k,), int64 indices of accepted draft nodes, root
            excluded, in path order.
        bonus: the token the model picks after the last accepted node.
    """

    accepted: np.ndarray
    bonus: int

    def kept_nodes(self) -> np.ndarray:
        """(k + 1,) int64: the nodes whose KV rows stay, the root 0 first, then ``accepted``."""
        k = self.accepted.shape[0]
        if not k:
            return ROOT_ONLY
        nodes = np.empty(k + 1, np.int64)
        nodes[0] = 0
        nodes[1:] = self.accepted
        return nodes

    def new_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """(k + 1,) int64: the tokens this verdict emits, the accepted nodes' (of the tree's
        ``tokens`` (n,)) and then the bonus token."""
        k = self.accepted.shape[0]
        new = np.empty(k + 1, np.int64)
        new[:k] = tokens[self.accepted]
        new[k] = self.bonus
        return new


ROOT_ONLY = np.zeros(1, np.int64)  # ``Verdict.kept_nodes`` where nothing was accepted; shared, so read-only
ROOT_ONLY.flags.writeable = False


def node_scores(
    tree: DraftTree,
    logits: torch.Tensor,
    node: int,
    processor: LogitsProcessor | None,
    prefix: torch.Tensor,
) -> torch.Tensor:
    """Processed scores, shape (V,), float32, at ``node``.

    ``prefix``: shape (L,), int64 ids of the context up to and including the
    root. The processor sees that prefix extended by the path to ``node``,
    exactly as plain decoding would have shown it.
    """
    row = logits[node].to(torch.float32)
    if not has_processor(processor):
        return row
    path = torch.from_numpy(tree.tokens[tree.path_to(node)])
    ids = torch.cat([prefix, path.to(prefix.device)]).unsqueeze(0)
    return processor(ids, row.unsqueeze(0)).squeeze(0)


def verify_greedy(
    tree: DraftTree,
    logits: torch.Tensor,
    processor: LogitsProcessor | None = None,
    prefix: torch.Tensor | None = None,
) -> Verdict:
    """Follow the argmax token from the root while a child carries it.

    Args:
        tree: the drafted tree, n nodes.
        logits: shape (n, V), the model's logits at every node.
        processor: applied to each visited node's logits with its own prefix.
        prefix: shape (L,), context ids through the root (needed with a processor).
    """
    if not has_processor(processor):
        return walk(tree, argmax_rows(logits).numpy(force=True))
    return walk(tree, lambda node: int(argmax_rows(node_scores(tree, logits, node, processor, prefix)[None])[0]))


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    processor: LogitsProcessor | None,
    prefix: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Multi-draft speculative sampling down the tree; the output follows the model exactly.

    The law is the multi-draft rule for deterministic drafts (q one-hot):
    at a node with model distribution p, try the children in turn, accept
    child c with probability min(1, p'(c) / q(c)) = p'(c), where p' is the
    residual left by the children already rejected (p with their mass
    removed, renormalised), and when every child is rejected draw the bonus
    token from the final residual. ``p`` is softmax of the processed scores,
    as in HF sampling.

    It is realised with one Gumbel-max draw per emitted token: x =
    argmax(log p + G) with G from ``generator``; child c is accepted iff x == c,
    else x is the bonus. Given that the children tried so far lost, x == c has
    probability exactly p'(c), and x given that all lost is distributed as the
    final residual, so this is the rule above, coupled. Each emitted token
    consumes the same randomness whatever the tree looks like, so a seed
    fixes the output even though tree sizes follow measured timings.
    """
    tiny = torch.finfo(torch.float32).tiny

    def draw(node: int) -> int:
        log_p = torch.log_softmax(node_scores(tree, logits, node, processor, prefix), dim=-1)
        uniform = torch.rand(log_p.shape, generator=generator).clamp_(tiny, 1.0 - 1e-7)
        return int(torch.argmax(log_p - torch.log(-torch.log(uniform))))

    return walk(tree, draw)


def walk(tree: DraftTree, pick: "np.ndarray | Callable[[int], int]") -> Verdict:
    """Accept down the tree while a child carries the token picked at its parent: the one walk
    of every verification (``_walked``, compiled).

    ``pick``: the token the model picks at each node, either computed for every node at once
    (shape (n,), any integer dtype: ``greedy_choices`` / ``sampling_choices``, so that one host
    read serves the whole walk) or a function of the node computing it when the walk gets
    there (the lazy walks of ``verify_greedy`` / ``verify_sampling``, which visit only the
    nodes on the accepted path: each node's pick is computed as the walk reaches it, and the
    compiled walk takes the one step it allows).
    """
    if tree.size == 1:  # a lone root (most rows on fresh prompts): nothing to walk
        return Verdict(EMPTY_INT64, int(pick(0)) if callable(pick) else int(pick[0]))
    if not callable(pick):
        accepted, last = _walked(tree.parents, tree.tokens, np.asarray(pick, dtype=np.int64), 0)
        return Verdict(accepted, int(pick[last]))
    picks = np.full(tree.size, -1, dtype=np.int64)  # -1: not computed (token ids are >= 0)
    node, accepted = 0, []
    while True:
        picks[node] = int(pick(node))
        _, below = _walked(tree.parents, tree.tokens, picks, node)  # at most one step: no pick below is known
        if below == node:
            return Verdict(np.asarray(accepted, dtype=np.int64), int(picks[node]))
        accepted.append(below)
        node = below


@numba.njit(cache=True, nogil=True)
def _walked(parents: np.ndarray, tokens: np.ndarray, picks: np.ndarray, start: int):  # pragma: no cover - compiled
    """From node ``start`` of a topological tree (``parents``, ``tokens`` (n,), root 0), step to the
    child whose token is its parent's pick (``picks`` (n,), -1: not known) while there is one.
    Returns the nodes stepped to, (k,) int64 in path order, and the node the walk stopped at
    (whose pick is the bonus token, or is not known)."""
    n = parents.shape[0]
    path = np.empty(n, np.int64)
    node, k = start, 0
    while picks[node] >= 0:
        child = -1
        for i in range(node + 1, n):  # children come after their parent
            if parents[i] == node and tokens[i] == picks[node]:
                child = i
                break
        if child < 0:
            break
        path[k] = child
        k += 1
        node = child
    return path[:k].copy(), node


def greedy_choices(
    tree: DraftTree, logits: torch.Tensor, processor: LogitsProcessor | None, prefix: np.ndarray
) -> torch.Tensor:
    """The greedy pick at every node, shape (n,), int64, on ``logits``' device (no host read).

    Equals ``verify_greedy``'s pick at each node it visits. ``prefix``: shape (L,), int64,
    the context through the root (read only with a processor).
    """
    if not has_processor(processor):
        return argmax_rows(logits)
    return argmax_rows(tree_scores(tree, logits, processor, prefix))


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest entry, shape (n,), int64, on ``scores``' device; ties and
    NaN as ``torch.argmax`` (the first). On CPU numpy's argmax: torch's costs ~15x more there
    over a vocabulary-wide row (40 us against 3 us at V = 49,152)."""
    if transfer.computes_on_host(scores):
        return torch.from_numpy(scores.numpy().argmax(axis=-1))
    return scores.argmax(dim=-1)


def sampling_choices(
    tree: DraftTree,
    logits: torch.Tensor,
    processor: LogitsProcessor | None,
    prefix: np.ndarray,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, Callable[[int], None]]:
    """``verify_sampling``'s Gumbel-max pick at every node at once: shape (n,), int64, on ``logits``' device.

    The node at depth d uses the (d + 1)-th draw of ``generator`` (the d-th
    emitted token's noise, as in ``verify_sampling``), so one draw per depth
    serves every node. Returns the picks and ``rewind(k)``: after ``walk``
    accepted k nodes, it leaves ``generator`` as if ``verify_sampling`` had
    run (k + 1 draws consumed), so a seed gives the same tokens either way.
    """
    scores = tree_scores(tree, logits, processor, prefix) if has_processor(processor) else logits.to(torch.float32)
    log_p = torch.log_softmax(scores, dim=-1)
    source = generator if generator is not None else torch.default_generator
    tiny = torch.finfo(torch.float32).tiny
    draws, states = [], []
    for _ in range(int(tree.depths.max()) + 1):
        draws.append(torch.rand(log_p.shape[-1], generator=source, device=source.device))
        states.append(source.get_state())
    uniform = torch.stack(draws).to(log_p.device, non_blocking=True).clamp_(tiny, 1.0 - 1e-7)
    depths = torch.tensor(tree.depths, device=log_p.device)  # a copy: a lone root's depths are read-only
    choices = torch.argmax(log_p - torch.log(-torch.log(uniform))[depths], dim=-1)
    return choices, lambda accepted: source.set_state(states[accepted])


def tree_scores(
    tree: DraftTree, logits: torch.Tensor, processor: LogitsProcessor, prefix: np.ndarray
) -> torch.Tensor:
    """``node_scores`` of every node, shape (n, V), float32, on ``logits``' device, with no host read.

    The processor sees each node alone (batch 1, as ``node_scores`` shows it):
    HF processors may hold per-batch-row state (``RepetitionPenaltyLogitsProcessor``'s
    ``prompt_ignore_length``) that a batch of nodes would not fit. ``prefix`` and
    the paths reach the device in one copy.
    """
    from retrieval_draft.model.transfer import to_device

    n, depth = tree.size, int(tree.depths.max())
    paths = np.zeros((n, max(depth, 1)), dtype=np.int64)  # row i: the path to node i, root excluded
    rows, cursor, column = np.arange(n), np.arange(n), tree.depths - 1
    for _ in range(depth):
        live = column >= 0
        paths[rows[live], column[live]] = tree.tokens[cursor[live]]
        cursor, column = np.where(live, tree.parents[cursor], cursor), column - 1
    paths_t, prefix_t = to_device([paths, np.ascontiguousarray(prefix, dtype=np.int64)], logits.device)
    scores = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    for node, node_depth in enumerate(tree.depths.tolist()):
        ids = torch.cat([prefix_t, paths_t[node, :node_depth]]).unsqueeze(0)
        scores[node] = processor(ids, logits[node : node + 1].to(torch.float32))[0]
    return scores


def has_processor(processor: LogitsProcessor | None) -> bool:
    """Whether ``processor`` would change any scores (None and empty lists do not)."""
    return processor is not None and len(processor) > 0


@dataclass(frozen=True)
class TreeJob:
    """One tree to verify: row ``i`` of a step's batch, whose logits are ``logits[i, :n]`` of the
    batch's (B, W, V) logits (``verify_trees``).

    Attributes:
        tree: n nodes (n <= W).
        prefix: (L,) int64 host ids through the root (what a processor sees before the path).
        processor: this tree's row's logits processor (``model.row_processors``), or None.
        generator: the sampling stream (None: torch's global one; unused when greedy).
        observers: drafters that record the tree (``observes_trees``).
    """

    tree: DraftTree
    prefix: np.ndarray
    processor: LogitsProcessor | None = None
    generator: torch.Generator | None = None
    observers: Sequence[Drafter] = ()


# Per job, observer name -> seconds it spent recording that job's tree (its share of its request,
# read and receive): what observing costs that drafter, for the drafter gate to weigh.
ObservedSeconds = list[dict[str, float]]


def _charge(spent: dict[str, float], observer: Drafter, seconds: float) -> None:
    """``observer`` spent ``seconds`` more recording one job's tree (an entry of ``ObservedSeconds``)."""
    spent[observer.name] = spent.get(observer.name, 0.0) + seconds


def walks_on_host(device: torch.device, do_sample: bool, processor: LogitsProcessor | None) -> bool:
    """Whether to verify node by node (``verify_greedy`` / ``verify_sampling``) instead of
    ``read_verdicts``: on CPU, when sampling or processing (there the lazy walk does less work)."""
    return device.type == "cpu" and (do_sample or has_processor(processor))


def verify_trees(
    jobs: Sequence[TreeJob], logits: torch.Tensor, do_sample: bool
) -> tuple[list[Verdict], ObservedSeconds]:
    """Every job's verdict, its observers fed. Job ``i`` is row ``i`` of the step's ``logits``
    (B, W, V), on the model's device: its tree's logits are ``logits[i, :n_i]``. Node by node on
    the host where ``walks_on_host`` says so, all the other jobs together with ONE host read
    (``read_verdicts``). Also returns what each job's observers spent recording its tree."""
    on_host = [walks_on_host(logits.device, do_sample, job.processor) for job in jobs]
    if not any(on_host):
        return read_verdicts(jobs, logits, do_sample)
    verdicts: list[Verdict | None] = [None] * len(jobs)
    observed: ObservedSeconds = [{} for _ in jobs]
    for i, job in enumerate(jobs):
        if not on_host[i]:
            continue
        scored, prefix = logits[i, : job.tree.size], torch.from_numpy(job.prefix)
        if do_sample:
            verdicts[i] = verify_sampling(job.tree, scored, job.processor, prefix, job.generator)
        else:
            verdicts[i] = verify_greedy(job.tree, scored, job.processor, prefix)
        for observer in job.observers:
            started = time.perf_counter()
            observer.observe_tree(job.tree.tokens, scored, job.tree.likeliest(observer.max_observed_nodes))
            _charge(observed[i], observer, time.perf_counter() - started)
    fused = [i for i, walked in enumerate(on_host) if not walked]
    if fused:
        for i, verdict, seconds in zip(fused, *read_verdicts(jobs, logits, do_sample, fused)):
            verdicts[i], observed[i] = verdict, seconds
    return verdicts, observed


def read_verdicts(
    jobs: Sequence[TreeJob], logits: torch.Tensor, do_sample: bool, rows: Sequence[int] | None = None
) -> tuple[list[Verdict], ObservedSeconds]:
    """Verify the trees of ``rows`` (indices into ``jobs`` and ``logits`` (B, W, V), as in
    ``verify_trees``; None: all) with ONE host read; feed their observers from the same read.
    Returns one verdict and one ``ObservedSeconds`` entry per row of ``rows``, in its order.

    Each observer (a drafter shared by rows is one observer) computes its request once, over
    the likeliest nodes (``Drafter.max_observed_nodes``) of every tree it observes; the trees
    share what it spent (the second list returned). Greedy verdicts equal ``verify_greedy``'s;
    sampled ones equal ``verify_sampling``'s with the same generator state, which is left as
    ``verify_sampling`` leaves it.
    """
    rows = list(range(len(jobs))) if rows is None else list(rows)
    chosen = [jobs[i] for i in rows]
    sizes = [job.tree.size for job in chosen]

    def scored(k: int) -> torch.Tensor:
        """Tree ``k``'s logits (n_k, V): a view, made only where something reads it."""
        return logits[rows[k], : sizes[k]]

    observed: ObservedSeconds = [{} for _ in rows]
    rewinds = []
    on_host = transfer.computes_on_host(logits)
    together = (not do_sample and len(rows) == logits.shape[0]
                and picks_together(sizes, any(has_processor(job.processor) for job in chosen), on_host))
    if together:
        width = max(sizes)  # the step's W where the trees are the step's (no slicing then: 2-4 us)
        blocks = [argmax_rows(logits if width == logits.shape[1] else logits[:, :width])]  # (B, max n)
    elif do_sample:
        blocks = []
        for k, job in enumerate(chosen):
            choices, rewind = sampling_choices(job.tree, scored(k), job.processor, job.prefix, job.generator)
            blocks.append(choices)
            rewinds.append(rewind)
    else:
        blocks = [greedy_choices(job.tree, scored(k), job.processor, job.prefix) for k, job in enumerate(chosen)]
    choice_blocks = len(blocks)
    groups = _observer_groups(chosen)
    chosen_nodes, spent = [], []
    for observer, members in groups:
        started = time.perf_counter()
        nodes = [chosen[k].tree.likeliest(observer.max_observed_nodes) for k in members]
        blocks.append(observer.tree_request([scored(k) for k in members], nodes))
        chosen_nodes.append(nodes)
        spent.append(time.perf_counter() - started)
    host = _read_together(blocks, host_arrays=on_host)
    for (observer, members), nodes, columns, requested in zip(groups, chosen_nodes, host[choice_blocks:], spent):
        started = time.perf_counter()
        row = 0
        for k, nodes_k in zip(members, nodes):
            observer.tree_receive(chosen[k].tree.tokens[nodes_k], columns[row : row + nodes_k.shape[0]])
            row += nodes_k.shape[0]
        share = (requested + time.perf_counter() - started) / len(members)  # the trees share the group's time
        for k in members:
            _charge(observed[k], observer, share)
    picks = [host[0][k, :n] for k, n in enumerate(sizes)] if together else host[:choice_blocks]
    verdicts = []
    for k, (job, job_picks) in enumerate(zip(chosen, picks)):
        verdict = walk(job.tree, job_picks)
        if rewinds:
            rewinds[k](int(verdict.accepted.shape[0]))
        verdicts.append(verdict)
    return verdicts, observed


def picks_together(sizes: Sequence[int], processed: bool, on_host: bool) -> bool:
    """Whether greedy picks for trees of ``sizes`` nodes (one per row of the step's (B, W, V)
    logits) come cheaper from ONE argmax over ``logits[:, :max(sizes)]`` than from one per tree:
    never where a processor changes some row's scores (``processed``); always on a device (one
    kernel); on the host (``on_host``: ``transfer.computes_on_host``) only when every tree has
    the widest one's size, as a fresh batch's lone roots do. There a padded slot is a
    vocabulary-wide row the matmul has just written, read for nothing, and costs more than the
    call it saves (SmolLM2's vocabulary on a 2-core Xeon, scratch timings of both ways: eight
    lone roots 63-103 us in one argmax against 98-202 us in eight; one tree of 2 nodes and seven
    lone roots 136 us against 94, of 5 and 4 nodes with one slot padded 407 against 398).
    """
    if processed:
        return False
    return not on_host or min(sizes) == max(sizes)


def _read_together(blocks: Sequence[torch.Tensor], host_arrays: bool) -> list[np.ndarray]:
    """Each of ``blocks`` (integer tensors, int32 where wider values are not needed past the
    read) on the host: views where the tensors are host arrays already (``host_arrays``: on
    CPU, ``transfer.computes_on_host``), else ONE read (``transfer.to_host``) of all of them
    flattened to int32 and laid end to end, split back into their shapes."""
    if host_arrays:
        return [block.numpy() for block in blocks]
    host = to_host(torch.cat([block.reshape(-1).to(torch.int32) for block in blocks]))
    arrays, start = [], 0
    for block in blocks:
        arrays.append(host[start : start + block.numel()].reshape(block.shape))
        start += block.numel()
    return arrays


def _observer_groups(jobs: Sequence[TreeJob]) -> list[tuple[Drafter, list[int]]]:
    """Each distinct observer (by identity) with the indices of the jobs it observes, in order."""
    groups: dict[int, tuple[Drafter, list[int]]] = {}
    for i, job in enumerate(jobs):
        for observer in job.observers:
            groups.setdefault(id(observer), (observer, []))[1].append(i)
    return list(groups.values())
