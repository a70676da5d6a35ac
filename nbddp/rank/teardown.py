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

A second race of the same kind, at the other end: gloo's ``init_process_group`` returns on a
rank as soon as *its* side of every connection is made, while a peer may still be completing
its own handshake (``connectFullMesh``). A rank that then ends at once (``destroy_process_group()``
right after init, or the cell simply returning, as lesson 01's first cell does) closes its
sockets under that peer, which fails with "Gloo connectFullMesh failed ... Connection closed by
peer" (measured: 14 of 100 four-rank launches of init + destroy with both cores busy; the same
under torchrun, whose agent does nothing here). torch has the cure behind a switch
(``TORCH_DIST_INIT_BARRIER=1``: a store-based barrier after init); setting it would change the
ranks' environment, so the rank's ``init_process_group`` does that barrier itself for gloo's
default group: every rank returns from init only once all have finished theirs.
"""
from __future__ import annotations

import functools
import sys
import time

PAUSE_S = 0.005
_ORIGINAL = "__nbddp_original__"


def install() -> bool:
    """Wrap ``destroy_process_group`` and ``init_process_group`` where torch.distributed is
    already imported (always in a forkserver rank: it is preloaded). True when installed."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    dist = sys.modules.get("torch.distributed")
    if c10d is None or dist is None:
        return False
    wrappers = (("destroy_process_group", _wrap), ("init_process_group", lambda f: _wrap_init(f, c10d)))
    for name, wrap in wrappers:
        original = getattr(c10d, name, None)
        if original is not None and not hasattr(original, _ORIGINAL):
            setattr(c10d, name, wrap(original))
            if getattr(dist, name, None) is original:
                setattr(dist, name, getattr(c10d, name))
    return getattr(c10d, "destroy_process_group", None) is not None


def _wrap_init(original, c10d):
    inits = [0]  # this process's inits so far: every rank makes the same calls, so a key per init

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        inits[0] += 1
        try:
            group = c10d._get_default_group()
            world = group.size()
            gloo = c10d.get_backend(group) == "gloo"
            store = c10d._get_default_store() if gloo and world > 1 else None
        except Exception:  # noqa: BLE001 - another torch's internals: no barrier, torch as it is
            store = None
        if store is not None:
            _all_initialised(store, f"nbddp/init/{inits[0]}", world, kwargs.get("timeout"))
        return result

    setattr(init_process_group, _ORIGINAL, original)
    return init_process_group


def _all_initialised(store, key: str, world: int, timeout) -> None:
    """A barrier on the group's store (as torch's ``_store_based_barrier``): count in, and the
    last rank in says so; the others wait for that word, up to the init's own timeout."""
    import datetime

    if store.add(key, 1) == world:
        store.set(key + "/all", b"1")
        return
    store.wait([key + "/all"], timeout or datetime.timedelta(minutes=30))


def _wrap(original):
    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        time.sleep(PAUSE_S)  # releases the GIL: gloo's threads drop their finished work first
        return original(*args, **kwargs)

    setattr(destroy_process_group, _ORIGINAL, original)
    return destroy_process_group
