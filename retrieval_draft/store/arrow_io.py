"""Arrow IPC files: write one record batch per file, read memory-mapped and validated.

Arrays come back as zero-copy numpy views of the memory map. Fixed-size
list columns come back as 2-D arrays of shape (rows, list_size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from retrieval_draft.atomic import atomic_path
from retrieval_draft.errors import CorruptDatastoreError


def column(values: np.ndarray) -> pa.Array:
    """An Arrow array of a 1-D numpy array, or a fixed-size list array of a 2-D one."""
    if values.ndim == 1:
        return pa.array(values)
    width = values.shape[1]
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, width)


def write_table(path: Path, columns: dict[str, np.ndarray]) -> None:
    """Write ``columns`` (equal lengths) as one record batch to ``path`` atomically."""
    batch = pa.record_batch([column(v) for v in columns.values()], names=list(columns))
    with atomic_path(path) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)


def read_table(path: Path, expected: dict[str, pa.DataType], *, full: bool = True) -> dict[str, np.ndarray]:
    """Open ``path`` memory-mapped, validate it, check the schema, return numpy views.

    ``full``: ``validate(full=True)``, which reads every value; False checks
    only the structure (for a file whose bytes were verified before).
    Raises CorruptDatastoreError on a truncated, malformed or unexpected file.
    """
    try:
        source = pa.memory_map(str(path), "r")
        table = pa.ipc.open_file(source).read_all()
        table.validate(full=full)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptDatastoreError(f"{path.name}: unreadable Arrow file ({exc})".splitlines()[0]) from exc
    for name, dtype in expected.items():
        if name not in table.column_names or not table.schema.field(name).type.equals(dtype):
            raise CorruptDatastoreError(f"{path.name}: expected column {name!r} of type {dtype}")
    if any(table.column(name).null_count for name in expected):
        raise CorruptDatastoreError(f"{path.name}: unexpected null values")
    return {name: _to_numpy(table.column(name)) for name in expected}


def _to_numpy(chunked: pa.ChunkedArray) -> np.ndarray:
    """Numpy view (zero copy when there is one chunk) of a primitive or fixed-size list column."""
    array = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
        flat = array.values.slice(array.offset * width, len(array) * width)
        return flat.to_numpy(zero_copy_only=True).reshape(len(array), width)
    return array.to_numpy(zero_copy_only=True)
