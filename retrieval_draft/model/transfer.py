"""Host <-> device copies for the step loop: one packed copy each way.

On a GPU every blocking copy waits for the stream, so a step that copies its
inputs in three tensors and reads three results back pays six round trips.
``to_device`` sends several host arrays in ONE copy (packed into a byte
buffer, viewed back on the device) and ``to_host`` is the one read the step
allows. On CPU ``to_device`` is ``torch.from_numpy`` (no copy at all), so
the CPU path costs what it did.
"""

from __future__ import annotations

import numpy as np
import torch

_ALIGN = 8  # bytes: every packed array starts at a multiple of the widest element size


def pack(arrays: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[int, np.dtype, tuple]]]:
    """Arrays laid end to end in one uint8 buffer, each starting 8-byte aligned.

    Returns the buffer, shape (bytes,), and per array its (offset, dtype, shape).
    """
    layout, offset = [], 0
    for array in arrays:
        layout.append((offset, array.dtype, array.shape))
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
    buffer = np.empty(offset, dtype=np.uint8)
    for array, (start, _, _) in zip(arrays, layout):
        buffer[start : start + array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return buffer, layout


def unpack(buffer: torch.Tensor, layout: list[tuple[int, np.dtype, tuple]]) -> list[torch.Tensor]:
    """Views of ``buffer`` (uint8, shape (bytes,), any device) as the arrays ``pack`` laid out."""
    views = []
    for start, dtype, shape in layout:
        kind = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        count = int(np.prod(shape, dtype=np.int64))
        size = count * np.dtype(dtype).itemsize
        views.append(buffer[start : start + size].view(kind).view(shape))
    return views


def to_device(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` as tensors on ``device``: shared memory on CPU, else ONE non-blocking copy.

    The packed host buffer is pageable, so the copy is staged before it
    returns; the views keep the device buffer alive.
    """
    if device.type == "cpu":
        return [torch.from_numpy(array) for array in arrays]
    buffer, layout = pack(arrays)
    return unpack(torch.from_numpy(buffer).to(device, non_blocking=True), layout)


def to_host(tensor: torch.Tensor) -> np.ndarray:
    """The step's one device -> host read: ``tensor`` as a numpy array (a view on CPU)."""
    return tensor.numpy(force=True)


def computes_on_host(tensor: torch.Tensor) -> bool:
    """Whether reductions over ``tensor`` (float32 logits rows) run faster as host arrays than as
    torch ops: on CPU, where ``.numpy()`` is a view and numpy's argmax / the compiled top-k cost
    a fraction of torch's (``verify.argmax_rows``, ``RecyclingDrafter.tree_request``). On a GPU
    the device computes them and the step's one host read brings the results."""
    return tensor.device.type == "cpu" and tensor.dtype == torch.float32
