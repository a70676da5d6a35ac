"""In a rank: ``torch.distributed.destroy_process_group`` never lets gloo's teardown deadlock.

Why (torch 2.13, gloo; seen in a DDP training cell ending in destroy + return): a gloo work item
keeps the thread-local state of the thread that issued it, and DDP's gradient all-reduces are
issued inside ``backward()``, where torch stashes a Python object (a ``SafePyObject``) in that
state. The worker thread that ran the work drops it after the fact, holding gloo's work mutex,
and needs the GIL to free that object. If at that moment the main thread frees the last
reference to the process group (DDP's Reducer freed on return, after
``destroy_process_group()``), ``~ProcessGroupGloo`` takes the same mutex while holding the GIL:
a deadlock (pytorch#56297's class). gdb on a hung rank shows exactly that: the main thread in
``Reducer::~Reducer → ~ProcessGroupGloo → pthread_mutex_lock``, a ``pt_gloo_runloop`` thread in
``~AsyncWork → ~ThreadLocalState → take_gil``. How often depends on how soon the worker thread
is scheduled: 4 of 300 launches of tests/test_training_soak.py's cell (three loops at once on 2
cores), 1 of 30 with the 5 ms GIL-releasing pause nbddp used before when the test suite ran
three files at a time; a pause only makes it rarer.

So the rank's ``destroy_process_group`` keeps the groups it destroys (``_RETIRED``): torch
unregisters them as usual (``is_initialized()`` is False, a new ``init_process_group`` works),
but no reference the cell drops can be the last, so ``~ProcessGroupGloo`` never runs inside a
cell. A fresh rank ends with ``os._exit`` (nbddp/rank/worker.py), so it never runs at all; a
pool rank frees a cell's retired groups two cells later (``release_retired``), after it has
waited for the kernel twice with the GIL released, long after gloo's threads dropped their work.

The same wrapper keeps group names counting: torch resets its group counter when the default
group is destroyed, so the next ``init_process_group`` in the process (a second init in a cell,
the next cell in a pool) gets the same name, and gloo's rendezvous keys on the store ("0/rank_1")
are those of the last group. A rank that reads a peer's address before the peer has rewritten it
connects to the old group: "Gloo connectFullMesh failed ... Connection refused" (5 of 10
launches of four init/all_reduce/destroy rounds in one cell, torch as it is; the same under
torchrun, whose store outlives the groups), or a hang where the old group's listener is kept. With
the count kept, each init's keys are its own (0 of 10).

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

_ORIGINAL = "__nbddp_original__"
_RETIRED: list[list] = [[]]   # destroyed groups kept alive: the current cell's last


def install() -> bool:
    """Wrap ``destroy_process_group`` and ``init_process_group`` where torch.distributed is
    already imported (always in a forkserver rank: it is preloaded). True when installed."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    dist = sys.modules.get("torch.distributed")
    if c10d is None or dist is None:
        return False
    wrappers = (("destroy_process_group", lambda f: _wrap_destroy(f, c10d)),
                ("init_process_group", lambda f: _wrap_init(f, c10d)))
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
        except Exception:  # another torch's internals: no barrier, torch as it is
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


def _wrap_destroy(original, c10d):
    @functools.wraps(original)
    def destroy_process_group(group=None, *args, **kwargs):
        _RETIRED[-1].extend(_groups_destroyed(c10d, group))
        count = _group_count(c10d)
        try:
            return original(group, *args, **kwargs)
        finally:
            if count is not None and _group_count(c10d) == 0:
                c10d._world.group_count = count   # the next init's group gets a name of its own

    setattr(destroy_process_group, _ORIGINAL, original)
    return destroy_process_group


def _groups_destroyed(c10d, group) -> list:
    """The process groups ``destroy_process_group(group)`` unregisters: all, for the default."""
    try:
        world = c10d._world.pg_map
        if group is None or group is c10d.GroupMember.WORLD:
            return list(world)
        return [group]
    except Exception:  # another torch's internals: keep nothing, torch as it is
        return []


def _group_count(c10d):
    try:
        return c10d._world.group_count
    except Exception:  # another torch's internals: names as torch gives them
        return None


def release_retired(keep: int = 2) -> None:
    """A pool rank, before each cell: free the groups destroyed ``keep`` cells ago or earlier
    (their worker threads have long dropped their work), keep the later ones."""
    _RETIRED.append([])
    del _RETIRED[:-keep]
