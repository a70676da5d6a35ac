"""In a rank: ``torch.distributed.destroy_process_group`` lets torch's own threads finish first.

Why (measured, torch 2.13, gloo, 2 ranks, a DDP training cell ending in destroy + return): a
gloo work item keeps the thread-local state of the thread that issued it, and DDP's gradient
all-reduces are issued inside ``backward()``, where torch stashes a Python object (the
``contextvars`` context) in that state. When the last all-reduce completes, gloo's worker thread
drops the work and needs the GIL to free that object; the GIL goes back to the main thread at
once and the worker waits up to the 5 ms switch interval. If within those few ms the main
thread destroys the process group (``destroy_process_group()``, then DDP's Reducer freed on
return), ``~ProcessGroupGloo`` joins the worker thread while holding the GIL: a deadlock
(pytorch#56297's class). How often depends on how fast the code after the last ``backward()``
runs: 7 of 25 (and 6 of 20) launches with nbddp's preload, 2 of 12 with spawned ranks (a fresh
interpreter) that imported the same modules first, 0 of 12 spawned without them, 0 of 25 with
a 50 ms pause before ``destroy_process_group()``, 0 of 40 with this wrapper at 20 ms, and at
5 ms 0 of 60 idle and 0 of 40 with both cores kept busy (7 of 20 without it under that load);
tests/test_training_soak.py: 30 launches in a real kernel a mode, 7 of which hang without it. So the rank's ``destroy_process_group``
first releases the GIL for a moment (``PAUSE_S``), which lets a waiting worker thread finish;
nothing else changes (same function, same arguments, same result).
"""
from __future__ import annotations

import functools
import sys
import time

PAUSE_S = 0.005
_ORIGINAL = "__nbddp_original__"


def install() -> bool:
    """Wrap ``destroy_process_group`` where torch.distributed is already imported (always in a
    forkserver rank: it is preloaded). True when installed."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    dist = sys.modules.get("torch.distributed")
    if c10d is None or dist is None:
        return False
    original = getattr(c10d, "destroy_process_group", None)
    if original is None or hasattr(original, _ORIGINAL):
        return original is not None
    wrapped = _wrap(original)
    c10d.destroy_process_group = wrapped
    if getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = wrapped
    return True


def _wrap(original):
    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        time.sleep(PAUSE_S)  # releases the GIL: gloo's threads drop their finished work first
        return original(*args, **kwargs)

    setattr(destroy_process_group, _ORIGINAL, original)
    return destroy_process_group
