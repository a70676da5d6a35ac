"""GPU placement: one CUDA device per local rank, chosen with ``--gpus 0,1,3``; nccl as the
default backend where CUDA exists.

Pure: the device count is a parameter (torch's, asked of the forkserver's store host,
nbddp/forkserver/storehost.py, so the kernel never imports torch), so every rule is tested on
CPU. With ``--gpus`` the ranks get ``CUDA_VISIBLE_DEVICES`` listing the chosen devices, as
cluster schedulers do, so ``cuda:LOCAL_RANK`` is the LOCAL_RANK-th chosen device and unchanged
torchrun code keeps working."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nbddp.core.errors import DDPUsageError

if TYPE_CHECKING:
    from nbddp.core.spec import LaunchSpec


@dataclass(frozen=True)
class Placement:
    """Where the ranks of one node go."""

    devices: tuple[int, ...]   # the chosen devices, as numbered where nbddp runs (before remapping)
    physical: tuple[str, ...]  # the same devices as CUDA_VISIBLE_DEVICES entries
    backend: str               # gloo, nccl or mpi
    env: tuple[tuple[str, str], ...] = ()  # what every rank of this node gets added
    note: str = ""             # said once at the start of the launch (e.g. why auto chose gloo)

    def device_of(self, local_rank: int) -> str | None:
        """The torch device string a rank should use (``cuda:LOCAL_RANK``), None without GPUs."""
        if not self.devices:
            return None
        return f"cuda:{local_rank % len(self.devices)}"


def _visible(base_env: Mapping[str, str] | None, device_count: int) -> list[str]:
    """The device names torch numbers 0..count-1 here (respecting an existing CUDA_VISIBLE_DEVICES)."""
    current = (base_env or {}).get("CUDA_VISIBLE_DEVICES")
    if current is not None and current.strip() != "":
        names = [part.strip() for part in current.split(",") if part.strip()]
        return names[:device_count] if len(names) >= device_count else names
    return [str(i) for i in range(device_count)]


def auto_backend(devices: int, ranks_per_node: int) -> str:
    """``--backend auto``'s rule: nccl where the node has a GPU for each of its ranks (nccl
    refuses two ranks on one GPU), else gloo, which runs anywhere."""
    return "nccl" if devices and ranks_per_node <= devices else "gloo"


def plan(spec: LaunchSpec, device_count: int, base_env: Mapping[str, str] | None = None) -> Placement:
    """The placement for ``spec`` on a machine with ``device_count`` CUDA devices.
    Raises DDPUsageError (one line) for a choice that cannot work."""
    gpus = getattr(spec, "gpus", None)
    nproc = spec.nproc_per_node
    visible = _visible(base_env, device_count)
    if gpus is not None:
        if device_count == 0:
            raise DDPUsageError(f"%%ddp: --gpus {_join(gpus)} asks for CUDA devices, but this machine has none "
                             "(omit --gpus to run on CPU with gloo)")
        if len(set(gpus)) != len(gpus):
            raise DDPUsageError(f"%%ddp: --gpus {_join(gpus)} names a device twice")
        bad = [g for g in gpus if g >= device_count]
        if bad:
            raise DDPUsageError(f"%%ddp: --gpus {_join(bad)}: this machine has {device_count} CUDA device"
                             f"{'s' if device_count != 1 else ''} (0..{device_count - 1})")
        devices = tuple(gpus)
    else:
        devices = tuple(range(device_count))
    backend, note = spec.backend, ""
    if backend == "auto":
        backend = auto_backend(len(devices), nproc)
        if devices and backend == "gloo":  # nccl refuses two ranks on one GPU: gloo still runs
            note = (f"backend hint gloo, not nccl: {nproc} ranks per node but {len(devices)} GPU"
                    f"{'s' if len(devices) != 1 else ''} {'chosen' if gpus is not None else 'here'} "
                    f"(nccl needs one GPU per rank; use -n {len(devices)} per node for nccl)")
    if backend == "nccl":
        if not devices:
            raise DDPUsageError("%%ddp: --backend nccl needs CUDA devices and this machine has none; use gloo")
        if nproc > len(devices):
            raise DDPUsageError(f"%%ddp: {nproc} ranks per node but {len(devices)} GPU"
                             f"{'s' if len(devices) != 1 else ''} "
                             f"{'chosen' if gpus is not None else 'here'} (nccl needs one GPU per rank): "
                             f"use -n {len(devices)}, more --gpus, or --backend gloo")
    env: tuple[tuple[str, str], ...] = ()
    physical = tuple(visible[d] if d < len(visible) else str(d) for d in devices)
    if gpus is not None:
        env = (("CUDA_VISIBLE_DEVICES", ",".join(physical)),)
    return Placement(devices=devices, physical=physical, backend=backend, env=env, note=note)


def _join(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in values)
