"""The environment each rank gets: the same variables, with the same values, as torchrun sets.

Pure logic. ``tests/kernel/test_torchrun_env.py`` runs real torchrun and compares, so this list is
checked against torch itself rather than trusted.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # spec.py imports LAUNCHER_OWNED from here
    from nbddp.core.spec import LaunchSpec

# Variables whose values legitimately differ from launch to launch (compared by key only).
PER_LAUNCH_KEYS = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")

SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

# Of launcher_env's variables, those a user's --env must not override (spec.py refuses them):
# one would point ranks at a store nobody hosts, or give two ranks one rank number. Each maps
# to the option that says it instead. The rest (OMP_NUM_THREADS, TORCH_NCCL_ASYNC_ERROR_HANDLING,
# ROLE_NAME, TORCHELASTIC_SIGNALS_TO_HANDLE) a user may set, as under torchrun.
_SET_BY_TOPOLOGY = "choose the topology with -n, --nproc-per-node and --nnodes"
LAUNCHER_OWNED = {
    "MASTER_PORT": "use --master-port PORT", "MASTER_ADDR": "use --master-addr HOST",
    **{key: _SET_BY_TOPOLOGY for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                         "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")},
    **{key: "nbddp sets it for this launch (under --launcher torchrun, torchrun does)"
       for key in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
                   "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")},
}


# The JupyterHub server's API token (JPY_API_TOKEN: its older name), inherited by every kernel:
# it acts as the user towards the hub. Ranks (and srun, which copies the environment to every
# node) do not get it unless the cell names it with --env.
HUB_TOKENS = ("JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN")

# ``ray.init()`` in the kernel sets PYTHONBREAKPOINT to Ray's driver hook, which works only in
# that driver: a rank inheriting it fails at ``breakpoint()`` with an AttributeError from inside
# Ray. Ranks do not get that one value; any other PYTHONBREAKPOINT (0, ipdb...) is the user's.
RAY_DRIVER_BREAKPOINT = "ray.util.rpdb._driver_set_trace"


def inherited(base: Mapping[str, str], spec: LaunchSpec) -> dict[str, str]:
    """What a launch's processes inherit of ``base``: all of it but the hub's tokens, unless
    ``--env`` gives one explicitly, and Ray's driver-only breakpoint hook."""
    asked = {key for key, _ in spec.env}
    return {k: v for k, v in base.items() if (k not in HUB_TOKENS or k in asked)
            and not (k == "PYTHONBREAKPOINT" and v == RAY_DRIVER_BREAKPOINT)}


def launcher_env(spec: LaunchSpec, rank: int, *, master_port: int, run_id: str,
                 error_file: str, base_env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables torchrun's elastic agent adds for ``rank`` (without the inherited ones)."""
    base = os.environ if base_env is None else base_env
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(spec.local_rank_of(rank)),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_WORLD_SIZE": str(spec.nproc_per_node),
        "GROUP_RANK": str(spec.node_of(rank)),
        "GROUP_WORLD_SIZE": str(spec.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(spec.world_size),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if spec.nproc_per_node > 1 and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = "1"
    return env


def rank_env(spec: LaunchSpec, rank: int, *, master_port: int, run_id: str, error_file: str,
             base_env: dict[str, str] | None = None,
             devices_env: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """The whole environment of one rank: inherited (without the hub's token), plus torchrun's,
    plus the launch's GPU placement (``devices_env``: CUDA_VISIBLE_DEVICES with ``--gpus``,
    planned once per launch by nbddp/core/placement.py), plus the user's ``--env``. nbddp adds
    no variable of its own, so the key set is torchrun's."""
    base = inherited(os.environ if base_env is None else base_env, spec)
    env = dict(base)
    env.update(launcher_env(spec, rank, master_port=master_port, run_id=run_id,
                            error_file=error_file, base_env=base))
    env.update(dict(devices_env))  # nothing at all on a machine without CUDA
    env.update(dict(spec.env))
    return env


def legacy_flag(spec: LaunchSpec) -> str | None:
    """``--legacy-launch``: the flag torch.distributed.launch put in argv (None without it)."""
    if spec.legacy_launch is None:
        return None
    return "--local_rank" if spec.legacy_launch == "underscore" else "--local-rank"


def legacy_argv(spec: LaunchSpec, rank: int) -> list[str]:
    """The argument torch.distributed.launch put before the script's own (without --use-env)."""
    flag = legacy_flag(spec)
    return [] if flag is None else [f"{flag}={spec.local_rank_of(rank)}"]
