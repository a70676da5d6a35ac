"""torchrun's command line for a LaunchSpec, built in one place: for ``--launcher torchrun``
(nbddp/sources/torchrun.py), ``--launcher slurm``'s per-node script (nbddp/sources/slurm.py), the
exported Slurm job (nbddp/sources/slurm_script.py) and ``%ddp_export``'s commands per node
(nbddp/export.py). Pure: lists of words, no processes."""
from __future__ import annotations

import math
import os
import shlex
from collections.abc import Iterable
from dataclasses import replace

from nbddp.core.spec import LaunchSpec

RUN_MODULE = "torch.distributed.run"        # what the ``torchrun`` command runs
LEGACY_MODULE = "torch.distributed.launch"  # the deprecated launcher, which passes --local-rank
RANK_MODULE = "nbddp.rank.torchrun_rank"    # runs the cell inside each rank (status file, stacks)
DEFAULT_MASTER_PORT = 29500                 # torchrun's own default


def options(spec: LaunchSpec, node_rank: int | None = None) -> list[str]:
    """torchrun's options for ``spec`` (one node's view: ``node_rank`` where it matters):
    c10d at ``--rdzv-endpoint``, ``--standalone`` for one node, else a static master."""
    opts = [f"--nnodes={spec.nnodes}", f"--nproc-per-node={spec.nproc_per_node}"]
    if node_rank is None:
        node_rank = spec.node_rank
    if spec.rdzv_endpoint:
        opts += [f"--rdzv-backend={spec.rdzv_backend}", f"--rdzv-endpoint={spec.rdzv_endpoint}"]
        if spec.rdzv_id:
            opts.append(f"--rdzv-id={spec.rdzv_id}")
        if node_rank is not None:
            opts.append(f"--node-rank={node_rank}")
        opts += _join_timeout(spec)
    elif spec.nnodes == 1 and spec.master_port is None:
        opts.append("--standalone")
        opts += _join_timeout(spec)
    else:  # static: nbddp/core/launchrules.py checked that the port and the node rank are given
        opts += [f"--master-addr={spec.master_addr}", f"--master-port={spec.master_port}",
                 f"--node-rank={node_rank or 0}"]
        if spec.rdzv_timeout:
            opts.append(f"--rdzv-conf=timeout={math.ceil(spec.rdzv_timeout)}")
    if spec.max_restarts:
        opts.append(f"--max-restarts={spec.max_restarts}")
    return opts


def _join_timeout(spec: LaunchSpec) -> list[str]:
    return [f"--rdzv-conf=join_timeout={math.ceil(spec.rdzv_timeout)}"] if spec.rdzv_timeout else []


def slurm_options(spec: LaunchSpec, nnodes: str, endpoint: str, backend: str | None = None) -> list[str]:
    """torchrun's options inside a Slurm job, as shell words: the node count and the rendezvous
    endpoint come from the job (e.g. ``"$SLURM_NNODES"``, expanded by the job's shell). The
    rendezvous id and conf are not among them: the job gives them in torchrun's environment
    (``PET_RDZV_ID``, ``PET_RDZV_CONF``: slurm_rdzv_conf), which ``ps`` does not show other users."""
    return ([f"--nnodes={nnodes}", f"--nproc-per-node={spec.nproc_per_node}",
             f"--rdzv-backend={backend or spec.rdzv_backend}", f"--rdzv-endpoint={endpoint}"] +
            ([f"--max-restarts={spec.max_restarts}"] if spec.max_restarts else []))


def slurm_rdzv_conf(spec: LaunchSpec, is_host: str) -> str:
    """The c10d rendezvous conf of one node of a Slurm job: ``is_host`` says explicitly whether this
    node hosts the store (torch's own guess falls back to joining whatever store already listens
    on a taken port; explicit, the taken port fails), then the join timeout (conf_tail)."""
    return f"is_host={is_host}" + conf_tail(spec)


def conf_tail(spec: LaunchSpec) -> str:
    """``,join_timeout=N`` for a cell with ``--rdzv-timeout``, else nothing."""
    return f",join_timeout={math.ceil(spec.rdzv_timeout)}" if spec.rdzv_timeout else ""


def module(spec: LaunchSpec) -> str:
    """The launcher module a standalone job runs: ``torch.distributed.launch`` for a
    ``--legacy-launch`` cell (it reads ``--local-rank`` from argv), else torchrun's."""
    return RUN_MODULE if spec.legacy_launch is None else LEGACY_MODULE


def launcher_words(spec: LaunchSpec) -> list[str]:
    """``torchrun``; for a ``--legacy-launch`` cell the deprecated ``torch.distributed.launch``,
    which still passes that flag."""
    return ["torchrun"] if spec.legacy_launch is None else ["python", "-m", LEGACY_MODULE]


def rank_entry(log_dir: str, cell_path: str, script_args: Iterable[str]) -> list[str]:
    """What follows torchrun's options when nbddp watches the launch: every rank's output copied
    with a ``[rankN]:`` prefix (``--tee=3``), torchrun's logs in the log folder, and each rank
    running the cell through nbddp/rank/torchrun_rank.py."""
    return (["--tee=3", f"--log-dir={os.path.join(log_dir, 'torchrun')}", "-m", RANK_MODULE, cell_path]
            + list(script_args))


def agent_command(python: str, spec: LaunchSpec, log_dir: str, cell_path: str) -> list[str]:
    """The whole command of ``--launcher torchrun``'s agent."""
    return [python, "-m", RUN_MODULE] + options(spec) + rank_entry(log_dir, cell_path, spec.script_args)


MASK = "***"  # an --env value in a command the notebook shows


def node_commands(spec: LaunchSpec, script: str, masked: bool = False) -> list[str]:
    """One shell command line per node that runs ``script`` as the cell ran (a single one for a
    one-node cell); a static multi-node cell without a port gets torchrun's default port.
    ``masked``: the ``--env`` values shown as ``***`` (for the notebook: they may be secrets)."""
    if spec.nnodes > 1 and not spec.rdzv_endpoint and spec.master_port is None:
        spec = replace(spec, master_port=DEFAULT_MASTER_PORT)
    nodes: list[int | None]
    if spec.nnodes == 1 and not spec.rdzv_endpoint and spec.master_port is None:
        nodes = [None]
    else:
        nodes = list(range(spec.nnodes))
    tail = [shlex.quote(word) for word in [script] + list(spec.script_args)]
    env = [f"{k}={MASK if masked else shlex.quote(v)}" for k, v in spec.env]
    return [" ".join(env + launcher_words(spec) + options(spec, node_rank=node) + tail) for node in nodes]


def meeting_port(spec: LaunchSpec) -> int | None:
    """The port the nodes meet at, where the cell names one."""
    if spec.rdzv_endpoint and ":" in spec.rdzv_endpoint:
        return int(spec.rdzv_endpoint.rsplit(":", 1)[1])
    return spec.master_port or None
