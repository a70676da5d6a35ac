"""LaunchSpec: the shape and options of one launch, as torchrun would see them (the data only).

Pure: made and checked by nbddp/core/launchrules.py (from the ``%%ddp`` line or the Python API's
keywords), read by every source; the value domains of its options are named here.
"""
from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("auto", "gloo", "nccl", "mpi")
START_METHODS = ("forkserver", "spawn")
OUTPUTS = ("auto", "widgets", "text")
SAME_LINES = ("merge", "apart")   # identical lines of several ranks: once ([ranks 0–3]:) or per rank
LAUNCHERS = ("local", "torchrun", "slurm", "ray")


@dataclass(frozen=True)
class LaunchSpec:
    """The shape and options of one launch, as torchrun would see them."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int | None = None
    master_addr: str = "localhost"
    master_port: int | None = None
    backend: str = "auto"
    timeout: float | None = None
    env: tuple[tuple[str, str], ...] = ()
    legacy_launch: str | None = None  # None, "dash" (--local-rank=N) or "underscore"
    start_method: str = "forkserver"
    ranks_shown: tuple[int, ...] | None = None
    output: str = "auto"
    same_lines: str | None = None     # None: merge, unless NBDDP_SAME_LINES=apart (views/choose.py)
    log_dir: str | None = None
    script_args: tuple[str, ...] = ()
    launcher: str = "local"
    idle_warning: float | None = 30.0
    fresh: bool = False
    push: tuple[str, ...] = ()
    pull: tuple[str, ...] = ()
    diff: tuple[str, ...] = ()        # compared across the ranks at the cell's end (nbddp/core/rankdiff.py)
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    rdzv_id: str | None = None
    max_restarts: int = 0
    rdzv_timeout: float | None = None
    gpus: tuple[int, ...] | None = None
    export: str | None = None
    slurm: bool = False               # --export / %ddp_export also write SCRIPT.sbatch
    partition: str | None = None      # Slurm: --partition, --account, --time, raw #SBATCH lines
    account: str | None = None
    time_limit: str | None = None
    sbatch: tuple[str, ...] = ()
    ray_address: str | None = None    # --launcher ray: the cluster (else RAY_ADDRESS, else a local Ray)
    ray: bool = False                 # --export / %ddp_export also write SCRIPT_ray.py, a Ray job
    pdb: bool = False                 # a failing rank opens the debugger in the notebook (post-mortem)
    max_ranks: int | None = None      # past the machine's bound (nbddp/core/capacity.py), explicitly
    exit_grace: float = 300.0         # s a rank whose cell finished may take to exit (nbddp/sources/supervisor.py)
    fake: bool = False                # only ranks_shown (default rank 0) run, on torch's fake backend

    @property
    def ranks_run(self) -> tuple[int, ...]:
        """The ranks this launch starts here: every rank, or with ``fake`` only those shown."""
        if self.fake:
            return self.ranks_shown or (0,)
        return tuple(range(self.world_size))

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def node_of(self, rank: int) -> int:
        return rank // self.nproc_per_node

    def local_rank_of(self, rank: int) -> int:
        return rank % self.nproc_per_node

    def shown(self, rank: int) -> bool:
        if self.fake:
            return rank in self.ranks_run
        return self.ranks_shown is None or rank in self.ranks_shown
