"""A step's verification with one device -> host read for all its trees.

After the tree forward the step needs, per tree, the model's pick at the
nodes it walks (greedy or sampled) and whatever tree-observing drafters
record (the recycling table's top-k). On a GPU each of those read
separately is a round trip that waits for the stream. ``read_verdicts``
computes them all on the device (``verify.greedy_choices`` /
``sampling_choices``, ``Drafter.tree_request``), concatenates them into
one int32 tensor, reads it with ``transfer.to_host`` once, and only then
walks the trees and hands each drafter its columns.

On CPU a read is free and the node-by-node walk processes only the nodes
it visits, so where a logits processor or sampling is involved the engines
keep ``verify_greedy`` / ``verify_sampling`` there (``walks_on_host``);
plain greedy takes this module's path on every device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from retrieval_draft.tree import DraftTree
from retrieval_draft.decode.verify import (
    LogitsProcessor, Verdict, greedy_choices, has_processor, sampling_choices, verify_greedy, verify_sampling, walk,
)
from retrieval_draft.drafters.base import Drafter
from retrieval_draft.model.transfer import to_host


@dataclass(frozen=True)
class TreeJob:
    """One tree to verify.

    Attributes:
        tree: n nodes.
        logits: (n, V) the model's raw logits at every node, on the model's device.
        prefix: (L,) int64 host ids through the root (what a processor sees before the path).
        processor: this tree's row's logits processor (``model.row_processors``), or None.
        generator: the sampling stream (None: torch's global one; unused when greedy).
        observers: drafters that record the tree (``observes_trees``).
    """

    tree: DraftTree
    logits: torch.Tensor
    prefix: np.ndarray
    processor: LogitsProcessor | None = None
    generator: torch.Generator | None = None
    observers: Sequence[Drafter] = ()


def walks_on_host(device: torch.device, do_sample: bool, processor: LogitsProcessor | None) -> bool:
    """Whether to verify node by node (``verify_greedy`` / ``verify_sampling``) instead of
    ``read_verdicts``: on CPU, when sampling or processing (there the lazy walk does less work)."""
    return device.type == "cpu" and (do_sample or has_processor(processor))


def verify_trees(jobs: Sequence[TreeJob], do_sample: bool) -> list[Verdict]:
    """Every job's verdict, its observers fed: node by node on the host where ``walks_on_host``
    says so, all the other jobs together with ONE host read (``read_verdicts``)."""
    verdicts: list[Verdict | None] = [None] * len(jobs)
    fused = []
    for i, job in enumerate(jobs):
        if not walks_on_host(job.logits.device, do_sample, job.processor):
            fused.append(i)
            continue
        prefix = torch.from_numpy(job.prefix)
        if do_sample:
            verdicts[i] = verify_sampling(job.tree, job.logits, job.processor, prefix, job.generator)
        else:
            verdicts[i] = verify_greedy(job.tree, job.logits, job.processor, prefix)
        for observer in job.observers:
            observer.observe_tree(job.tree.tokens, job.logits)
    if fused:
        for i, verdict in zip(fused, read_verdicts([jobs[i] for i in fused], do_sample)):
            verdicts[i] = verdict
    return verdicts


def read_verdicts(jobs: Sequence[TreeJob], do_sample: bool) -> list[Verdict]:
    """Verify every job's tree with ONE host read; feed each job's observers from the same read.

    Each observer (a drafter shared by rows is one observer) computes its request once, over
    the nodes of every tree it observes. Greedy verdicts equal ``verify_greedy``'s; sampled ones
    equal ``verify_sampling``'s with the same generator state, which is left as
    ``verify_sampling`` leaves it.
    """
    blocks, rewinds = [], []
    for job in jobs:
        if do_sample:
            choices, rewind = sampling_choices(job.tree, job.logits, job.processor, job.prefix, job.generator)
        else:
            choices, rewind = greedy_choices(job.tree, job.logits, job.processor, job.prefix), None
        blocks.append(choices.to(torch.int32))
        rewinds.append(rewind)
    groups = _observer_groups(jobs)
    widths = []
    for observer, members in groups:
        request = observer.tree_request([jobs[i].logits for i in members])
        widths.append(request.shape[1])
        blocks.append(request.reshape(-1))
    host = to_host(blocks[0] if len(blocks) == 1 else torch.cat(blocks))
    sizes = [job.tree.size for job in jobs]
    offset = sum(sizes)
    for (observer, members), width in zip(groups, widths):
        nodes = sum(sizes[i] for i in members)
        columns = host[offset : offset + nodes * width].reshape(nodes, width)
        offset += nodes * width
        row = 0
        for i in members:
            observer.tree_receive(jobs[i].tree.tokens, columns[row : row + sizes[i]])
            row += sizes[i]
    verdicts, start = [], 0
    for job, rewind, size in zip(jobs, rewinds, sizes):
        verdict = walk(job.tree, host[start : start + size])
        start += size
        if rewind is not None:
            rewind(int(verdict.accepted.shape[0]))
        verdicts.append(verdict)
    return verdicts


def _observer_groups(jobs: Sequence[TreeJob]) -> list[tuple[Drafter, list[int]]]:
    """Each distinct observer (by identity) with the indices of the jobs it observes, in order."""
    groups: dict[int, tuple[Drafter, list[int]]] = {}
    for i, job in enumerate(jobs):
        for observer in job.observers:
            groups.setdefault(id(observer), (observer, []))[1].append(i)
    return list(groups.values())
