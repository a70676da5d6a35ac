"""What a rank's CUDA devices held during its cell, read when the cell ends so the report can say
it beside the rank's status (nbddp/core/gpureport.py): a GPU user's next question after "did it
run" is "how much memory, and on which device". Read only where the cell itself initialised
CUDA: a CPU cell, or a rank that never touched CUDA, makes no CUDA context here. Never raises:
a failing read costs the line, not the cell."""
from __future__ import annotations

import os
import sys


def _cuda():
    """torch.cuda where the cell has imported torch and initialised CUDA, else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:
        return None


def _visible_names(count: int) -> list[str]:
    """Each device's name outside this process: CUDA_VISIBLE_DEVICES's entries, else its index."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    names = [part.strip() for part in given.split(",") if part.strip()] if given else []
    return [names[i] if i < len(names) else str(i) for i in range(count)]


def measure() -> list[dict] | None:
    """Per device this rank allocated on: its index here (``cuda:N``), its name outside
    (``visible``), how many devices the rank sees (``count``), bytes allocated now, torch's
    peak allocated, and reserved by the caching allocator. None where CUDA was not used."""
    cuda = _cuda()
    if cuda is None:
        return None
    try:
        count = cuda.device_count()
        names = _visible_names(count)
        found = []
        for index in range(count):
            stats = cuda.memory_stats(index)  # the allocator's counters: no context is made for them
            peak = int(stats.get("allocated_bytes.all.peak", 0))
            reserved = int(stats.get("reserved_bytes.all.current", 0))
            if peak or reserved:
                found.append({"device": index, "visible": names[index], "count": count, "peak": peak,
                              "reserved": reserved, "allocated": int(stats.get("allocated_bytes.all.current", 0))})
        return found or None
    except Exception:
        return None


def reset_peaks() -> None:
    """A pool rank's next cell: its peak starts from what it holds, not from earlier cells'."""
    cuda = _cuda()
    if cuda is None:
        return
    try:
        for index in range(cuda.device_count()):
            if cuda.memory_stats(index).get("allocated_bytes.all.peak", 0):
                cuda.reset_peak_memory_stats(index)
    except Exception:
        pass
