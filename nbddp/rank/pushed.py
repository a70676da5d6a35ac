"""In a rank: the values the notebook pushed (``--push``), read from the one shared file the
kernel wrote (nbddp/kernel/pushing.py): a private copy-on-write map of it, the pickle stream
loaded with dill, and each CPU tensor's bytes copied out of the map into a storage of its own.
The tensor rebuilders live here, so unpickling in a rank imports nothing kernel-side."""
from __future__ import annotations

import mmap
import struct


def load(packed) -> dict:
    """The pushed values (``packed`` from pack; bytes from an older kernel)."""
    import dill

    if isinstance(packed, (bytes, bytearray)):
        return dill.loads(packed)
    with open(packed["path"], "rb") as f:
        # a private, copy-on-write map: writable (torch.frombuffer wants that), never written
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    count, size = struct.unpack_from("<2Q", view)
    lengths = struct.unpack_from(f"<{count}Q", view, 16)
    offset = 16 + 8 * count
    stream = view[offset:offset + size]
    offset += size
    buffers = []
    for length in lengths:
        buffers.append(view[offset:offset + length])
        offset += length
    return dill.loads(stream, buffers=buffers)


def rebuild_storage(buffer):
    import torch

    return torch.frombuffer(buffer, dtype=torch.uint8).clone().untyped_storage()


def rebuild_tensor(storage, dtype, shape, stride, offset, requires_grad):
    import torch

    t = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    return t.requires_grad_(True) if requires_grad else t
