"""The jobs of a launch's ranks (nbddp/core/job.py), built here once for fresh launches
(nbddp/sources/forkranks.py) and pools (nbddp/sources/pool.py), so both send the same thing."""
from __future__ import annotations

import sys
import uuid

from nbddp.core.envvars import legacy_argv, rank_env
from nbddp.core.job import Cell, RankJob
from nbddp.core.placement import Placement
from nbddp.core.rankfiles import RankFiles
from nbddp.forkserver import preload


def rank_jobs(spec, files: RankFiles, cell: Cell, *, master_port: int, cwd: str, base_env: dict,
              plan: Placement, func: dict | None = None, pool: bool = False) -> list[RankJob]:
    """One RankJob for each rank ``spec`` runs here (all; with --fake those it names): its torchrun
    environment (one run id and one GPU placement, ``plan``, for the launch), argv as torchrun
    would give the script, its files in ``files``."""
    run_id = str(uuid.uuid4())
    forget = preload.stale()  # preloaded user modules edited since: the ranks re-import them
    sys_path = list(sys.path)
    return [RankJob(rank=r,
                    env=rank_env(spec, r, master_port=master_port, run_id=run_id,
                                 error_file=files.error_file(r), base_env=base_env,
                                 devices_env=plan.env),
                    cwd=cwd, sys_path=sys_path,
                    argv=[cell.path] + legacy_argv(spec, r) + list(spec.script_args),
                    stack_path=files.stacks(r), sigint_path=files.sigint(r), backend=plan.backend,
                    cell=cell, func=func, pool=pool, forget=forget, fake=spec.fake)
            for r in spec.ranks_run]
