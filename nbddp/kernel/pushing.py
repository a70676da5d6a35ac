"""``--push``: the notebook's values are serialized once (dill) into one file in shared memory
(``/dev/shm``, else the temp folder) that every rank maps; only the file's name travels, so the
kernel's extra memory stays about 1x the values whatever the number of ranks. CPU tensors go out
of band (pickle protocol 5): their bytes follow the pickle stream, written straight from the
tensor's memory, and a rank copies them into a storage of its own (views keep sharing theirs).
Ranks read it with nbddp/rank/pushed.py; the file goes when the cell ends, or with the kernel
(nbddp/kernel/janitor.py)."""
from __future__ import annotations

import copyreg
import ctypes
import io
import os
import pickle
import struct
import sys
import tempfile
import uuid

from nbddp.kernel.janitor import remove_at_exit
from nbddp.kernel.logdirs import private
from nbddp.rank.pushed import rebuild_storage, rebuild_tensor  # what a rank rebuilds tensors with (by name)

_folder: str | None = None


def pack(values: dict | None) -> dict | None:
    """Write ``values`` for the ranks; returns what a rank needs to load them (or None)."""
    if not values:
        return None
    import dill

    path = os.path.join(_shared_folder(), f"push-{uuid.uuid4().hex}.dill")
    try:
        stream, buffers = io.BytesIO(), list[pickle.PickleBuffer]()
        pickler = dill.Pickler(stream, protocol=5, recurse=True, buffer_callback=buffers.append)
        _send_tensors_out_of_band(pickler)
        pickler.dump(dict(values))
        views = [buf.raw() for buf in buffers]
        header = struct.pack(f"<{2 + len(views)}Q", len(views), stream.tell(), *(v.nbytes for v in views))
        with open(path, "wb", opener=private) as f:
            f.write(header)
            f.write(stream.getbuffer())
            for view in views:
                f.write(view)
        del views, buffers
    except Exception:
        discard({"path": path})
        _name_the_culprit(values)
        raise TypeError("nbddp: the pushed values cannot be sent together") from None
    return {"path": path}


def _send_tensors_out_of_band(pickler) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    blobs: dict[int, _Blob] = {}  # one blob per storage, so views of it share it again in the rank

    def reduce_tensor(t):
        if not _plain_cpu_tensor(torch, t):
            return t.__reduce_ex__(5)
        storage = t.untyped_storage()
        blob = blobs.setdefault(storage.data_ptr(), _Blob(storage))
        return (rebuild_tensor, (blob, t.dtype, tuple(t.shape), t.stride(), t.storage_offset(),
                          t.requires_grad))

    pickler.dispatch_table = dict(copyreg.dispatch_table)
    pickler.dispatch_table[torch.Tensor] = reduce_tensor


def _plain_cpu_tensor(torch, t) -> bool:
    return (t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized
            and t.grad_fn is None and not t.is_conj() and not t.is_neg()
            and not getattr(t, "__dict__", None) and t.untyped_storage().nbytes() > 0
            and not getattr(t, "has_names", bool)())


class _Blob:
    """A tensor storage's bytes, pickled out of band (no copy in the kernel)."""

    def __init__(self, storage):
        self.storage = storage  # keeps the memory alive until the file is written

    def __reduce__(self):
        nbytes = self.storage.nbytes()
        raw = (ctypes.c_char * nbytes).from_address(self.storage.data_ptr())
        return (rebuild_storage, (pickle.PickleBuffer(memoryview(raw).cast("B")),))


def discard(packed) -> None:
    """The cell has ended: no rank reads the file any more."""
    if isinstance(packed, dict):
        try:
            os.unlink(packed["path"])
        except OSError:
            pass


def _name_the_culprit(values: dict) -> None:
    import dill

    for name, value in values.items():
        try:
            dill.dumps(value, recurse=True)
        except Exception as exc:
            raise TypeError(f"nbddp: cannot push {name!r} ({type(value).__name__}) to the ranks: "
                            f"{exc}") from None


def _shared_folder() -> str:
    global _folder
    if _folder is None or not os.path.isdir(_folder):
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
        # 0700; the kernel's pid in the name says whose it is (/dev/shm is shared by every kernel)
        _folder = tempfile.mkdtemp(prefix=f"nbddp-push-{os.getpid()}-", dir=base)
        remove_at_exit(_folder)
    return _folder

