"""In a ``--fake`` rank: every process group the cell makes lands on torch's fake backend, and
what the rank holds and sends is counted for its report (nbddp/core/fakereport.py).

torch picks a group's backend in ``_new_process_group_helper`` and the default group's store in
``rendezvous``, both looked up by name inside distributed_c10d: wrapping those two sends an
unchanged ``init_process_group("gloo")``, ``init_device_mesh`` or ``new_group`` to "fake" with a
FakeStore (no other rank is waited for). A dispatch mode records each collective's buffer and
group; DDP gets a comm hook that hands its bucket back; torch's MemTracker gives a step's peak."""
from __future__ import annotations

import os
import sys
from typing import Any

from nbddp.core import fakereport

_RECORDS: list[tuple[str, int, int, int]] = []  # (kind, buffer bytes, group size, steps done)
_STATE: dict[str, Any] = {"steps": 0, "mode": None, "notes": [], "tracker": None, "peaks": [], "no_peak": None}


def install() -> None:
    """Redirect process groups to the fake backend and start recording (before the cell runs)."""
    import torch.distributed.distributed_c10d as c10d
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    helper, fake = c10d._new_process_group_helper, c10d.Backend("fake")

    def new_group_on_fake(group_size, group_rank, global_ranks, backend, store, *args, **kwargs):
        return helper(group_size, group_rank, global_ranks, fake, store, *args, **kwargs)

    def rendezvous(url, rank=-1, world_size=-1, **kwargs):
        from torch.testing._internal.distributed.fake_pg import FakeStore

        rank = int(os.environ["RANK"]) if rank < 0 else rank
        world_size = int(os.environ["WORLD_SIZE"]) if world_size < 0 else world_size
        yield FakeStore(), rank, world_size

    c10d._new_process_group_helper = new_group_on_fake
    c10d.rendezvous = rendezvous
    _patch_ddp()
    register_optimizer_step_post_hook(_stepped)
    _STATE["tracker"], _STATE["no_peak"] = _memory_tracker()
    if _STATE["tracker"] is not None:
        _STATE["tracker"].__enter__()
    _STATE["mode"] = _recorder()
    _STATE["mode"].__enter__()


def _stepped(*_args) -> None:
    _STATE["steps"] += 1
    tracker = _STATE["tracker"]
    if tracker is not None:  # the peak of the phase that ends here; the next one starts from what is held now
        _STATE["peaks"].append(tracker.phase_peak())
        tracker.new_phase()


def _memory_tracker():
    """(torch's MemTracker made to follow a whole cell, None) or (None, why there is none).

    MemTracker refuses a root module's second forward in one tracked region (it keeps per-module
    stats of one iteration): here a new forward of a root module starts its stats afresh. The peak
    is kept per phase (between optimizer steps). A tracker that fails stops tracking, says why, and
    leaves the cell running as it would without it."""
    try:
        from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
    except ImportError as exc:
        return None, f"torch {_torch_version()} has no MemTracker ({exc})"

    class CellTracker(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self.failed: str | None = None
            self._phase: dict[str, Any] = {}  # device, total, by kind: the largest moment so far

        def _guarded(self, method, *args):
            if self.failed is None:
                try:
                    return method(*args)
                except Exception as exc:  # torch's private tool: the cell goes on
                    self.failed = f"torch's MemTracker failed in this cell ({type(exc).__name__}: {exc})"
            return None

        def _pre_fw_hook(self, module, inputs):
            def pre():
                name = self._mod_tracker.get_known_fqn(module)
                root = set(self._mod_tracker.parents) - {name} == {"Global"}
                if module in self.memory_tracking and root and not self._mod_tracker.is_bw:
                    self.reset_mod_stats()  # the next iteration
                MemTracker._pre_fw_hook(self, module, inputs)
            self._guarded(pre)

        def _post_fw_hook(self, *args):
            self._guarded(MemTracker._post_fw_hook, self, *args)

        def _pre_bw_hook(self, *args):
            self._guarded(MemTracker._pre_bw_hook, self, *args)

        def _post_bw_hook(self, *args):
            self._guarded(MemTracker._post_bw_hook, self, *args)

        def _track(self, *args):
            self._guarded(MemTracker._track, self, *args)

        def _update_peak_stats(self, peak_state) -> None:
            self._guarded(MemTracker._update_peak_stats, self, peak_state)
            self._guarded(self._note_phase_peak)

        def _note_phase_peak(self) -> None:
            for device, snap in self._curr_mem_snap.items():
                if snap[_TOTAL_KEY] > self._phase.get("total", -1):
                    self._phase = {"device": str(device), "total": int(snap[_TOTAL_KEY]),
                                   "by": {str(k.value): int(v) for k, v in snap.items() if k != _TOTAL_KEY}}

        def phase_peak(self) -> dict[str, Any] | None:
            return None if self.failed or not self._phase else dict(self._phase)

        def new_phase(self) -> None:  # starts from what is held now
            self._phase = {}
            self._guarded(self._note_phase_peak)

    try:
        return CellTracker(), None
    except Exception as exc:
        return None, f"torch's MemTracker could not start ({type(exc).__name__}: {exc})"


def _torch_version() -> str:
    import torch

    return torch.__version__


def _patch_ddp() -> None:
    """DDP runs unchanged: its cross-rank shape check reads values (none on meta, garbage from a
    fake all-gather) and is skipped; its buckets come back from a hook (recorded as all_reduce)."""
    import torch
    import torch.nn.parallel.distributed as ddp

    ddp._verify_param_shape_across_processes = lambda *args, **kwargs: None
    original = ddp.DistributedDataParallel.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        size = self.process_group.size() if self.process_group is not None else 1

        def bucket_back(state, bucket):
            buffer = bucket.buffer()
            _RECORDS.append(("all_reduce", buffer.numel() * buffer.element_size(), size, _STATE["steps"]))
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(buffer)
            return done

        self.register_comm_hook(None, bucket_back)
        if any(p.is_meta for p in self.module.parameters()):
            self.reducer = _NoRebuild(self.reducer)
            _STATE["notes"].append("DDP on meta keeps its first buckets (all its parameters in one): a "
                                   "real DDP rebuilds them after the first step (bucket_cap_mb each), so "
                                   "its all-reduces are more, of the same bytes in all")

    ddp.DistributedDataParallel.__init__ = __init__


class _NoRebuild:
    """DDP's reducer on meta parameters: it keeps its first buckets (rebuilding them in the
    backward's order reads the new order's values, which meta tensors do not have)."""

    def __init__(self, reducer):
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str):
        return getattr(self._reducer, name)


def _recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        """Records c10d and functional collectives: kind, buffer bytes, group size."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace in ("c10d", "_c10d_functional"):
                kind = fakereport.kind_of(func.overloadpacket.__name__)
                if kind is not None:
                    _RECORDS.append((kind, _buffer_bytes(args, out), _group_size(args), _STATE["steps"]))
            return out

    return Recorder()


def _nbytes(value) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _buffer_bytes(args, out) -> int:
    """The collective's full buffer: the largest of its first two arguments and its result
    (c10d ops: outputs, inputs; functional ops: input, result)."""
    return max([_nbytes(a) for a in args[:2]] + [_nbytes(out)])


def _group_size(args) -> int:
    """The group's size: c10d ops carry the group boxed, functional ones its name."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    for arg in args:
        if isinstance(arg, torch.ScriptObject) and "ProcessGroup" in str(arg._type()):
            return c10d.ProcessGroup.unbox(arg).size()
        if isinstance(arg, str):
            try:
                return c10d._resolve_process_group(arg).size()
            except Exception:
                continue
    return 1


def measure(namespace: dict) -> dict[str, Any]:
    """What the rank holds (the cell's modules' parameters and gradients, local shards of
    DTensors, its optimizers' state) and the collectives it recorded, as plain data."""
    import torch

    mode, _STATE["mode"] = _STATE["mode"], None
    if mode is not None:
        mode.__exit__(None, None, None)
    tracker, _STATE["tracker"] = _STATE["tracker"], None
    peaks, no_peak = list(_STATE["peaks"]), _STATE["no_peak"]
    if tracker is not None:
        peaks.append(tracker.phase_peak())  # the cell after its last optimizer step
        tracker.__exit__(None, None, None)
        no_peak = tracker.failed
    modules = [v for v in namespace.values() if isinstance(v, torch.nn.Module)]
    params = {id(p): p for m in modules for p in m.parameters()}
    optims = [v for v in namespace.values() if isinstance(v, torch.optim.Optimizer)]
    for opt in optims:  # an optimizer's parameters count even where its module is not a global
        params.update((id(p), p) for group in opt.param_groups for p in group["params"])
    state = {id(t): t for opt in optims for s in opt.state.values() for t in s.values()
             if isinstance(t, torch.Tensor)}
    return {"rank": int(os.environ.get("RANK", "0")), "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "modules": len(modules), "optimizers": len(optims),
            "params": sum(_local_bytes(p) for p in params.values()),
            "numel": sum(_local(p).numel() for p in params.values()),
            "grads": sum(_local_bytes(p.grad) for p in params.values() if p.grad is not None),
            "optim": sum(_local_bytes(t) for t in state.values()),
            "steps": _STATE["steps"], "collectives": list(_RECORDS), "peaks": peaks, "no_peak": no_peak,
            "notes": list(_STATE["notes"])}


def _local(tensor):
    to_local = getattr(tensor, "to_local", None)  # a DTensor: this rank's shard
    return to_local() if to_local is not None else tensor


def _local_bytes(tensor) -> int:
    local = _local(tensor)
    return local.numel() * local.element_size()


def report(namespace: dict) -> dict[str, Any]:
    """Measure, print the rank's report on its stdout, return the data for the kernel."""
    data = measure(namespace)
    sys.stdout.write("\n".join(fakereport.report_lines(data)) + "\n")
    sys.stdout.flush()
    return data
