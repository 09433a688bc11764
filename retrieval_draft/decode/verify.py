"""Verification of a scored token tree: pure functions over tensors.

Given the target model's logits at every tree node, walk down from the root
and decide which draft nodes the model accepts, plus one bonus token drawn
from the model at the last accepted node. No model, cache or I/O here.

Row ``i`` of ``logits`` is the model's next-token distribution after node
``i``'s prefix (the context up to the root, then the path to node ``i``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from retrieval_draft.decode.tree import DraftTree

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
    if processor is None or len(processor) == 0:
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
    kids = _child_lookup(tree)
    plain = processor is None or len(processor) == 0
    argmax = logits.argmax(dim=-1).tolist() if plain else None
    node, accepted = 0, []
    while True:
        if plain:
            choice = argmax[node]
        else:
            choice = int(node_scores(tree, logits, node, processor, prefix).argmax())
        child = kids.get((node, choice))
        if child is None:
            return Verdict(np.asarray(accepted, dtype=np.int64), choice)
        accepted.append(child)
        node = child


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
    kids = _child_lookup(tree)
    node, accepted = 0, []
    tiny = torch.finfo(torch.float32).tiny
    while True:
        log_p = torch.log_softmax(node_scores(tree, logits, node, processor, prefix), dim=-1)
        uniform = torch.rand(log_p.shape, generator=generator).clamp_(tiny, 1.0 - 1e-7)
        choice = int(torch.argmax(log_p - torch.log(-torch.log(uniform))))
        child = kids.get((node, choice))
        if child is None:
            return Verdict(np.asarray(accepted, dtype=np.int64), choice)
        accepted.append(child)
        node = child


def _child_lookup(tree: DraftTree) -> dict[tuple[int, int], int]:
    """(parent index, token id) -> child index."""
    return {
        (int(p), int(t)): i
        for i, (p, t) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist()))
        if i > 0
    }
