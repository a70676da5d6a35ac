"""In a rank: torch.distributed's init and destroy wrapped so a gloo group's teardown never deadlocks
and a new group never meets an old one (evidence: docs/explanation/reliability.md). Destroyed
groups are kept (``_RETIRED``) so no reference a cell drops is the last: freeing a gloo group while
its worker thread still drops a ``backward()`` work item deadlocks on the GIL and gloo's work mutex;
a fresh rank ends with ``os._exit``, a pool rank frees them two cells later (``release_retired``).
Group names keep counting (torch resets the count on destroy), so a new group's store keys are its
own. gloo's default group gets a store barrier after init (``TORCH_DIST_INIT_BARRIER=1``'s, the
ranks' environment unchanged), so no rank ends under a peer still connecting."""
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
