"""The Python API under the magic: ``nbddp.run(source_or_callable, n=4, ...)``.

Every launch comes through here (``%%ddp`` via nbddp/magic.py, ``nbddp.Pool.run``, scripts and
tests): the options become a LaunchSpec whose rules are checked before anything starts
(nbddp/core/launchrules.py: a DDPUsageError); ``launchrules.choose_source`` names the process
source and ``SOURCES``, the one table, maps it to its ``run(launch)``; the sinks
(nbddp/views/choose.py) and the request (nbddp/core/launch.py) are built once; the RunResult
comes back."""
from __future__ import annotations

import os
from dataclasses import replace

from nbddp.core import launchrules as rules, optionvalues as values
from nbddp.core.errors import DDPUsageError
from nbddp.core.launch import Launch
from nbddp.core.result import RunResult
from nbddp.core.spec import LaunchSpec
from nbddp.kernel import diffing, tracebacktheme
from nbddp.sources import local, pool as on_pool, ray, slurm, torchrun
from nbddp.views import choose

SOURCES = {"local": local.run, "pool": on_pool.run, "torchrun": torchrun.run, "slurm": slurm.run,
           "ray": ray.run}


def run(target, n: int | None = None, *, args=(), kwargs=None, spec: LaunchSpec | None = None,
        pool=None, sinks=None, shell=None, check: bool = True, cwd: str | None = None,
        env_base: dict | None = None, push: dict | None = None, cell_label: str | None = None,
        **options) -> RunResult:
    """Run ``target`` (a cell's source text, or a callable) on ranked workers; returns RunResult.

    Options are those of ``%%ddp`` with underscores (``nproc_per_node=2, nnodes=2,
    master_port=29500, timeout=10, env={...}, launcher="torchrun"``), or a whole ``spec``.
    ``pool``: a started ``nbddp.Pool`` runs the cell on its ranks (unless ``fresh=True``).
    ``sinks``: where the events go (default: as ``--output`` chooses for ``shell``, text
    outside a kernel; ``[]`` shows nothing). With ``check`` (the default) a failed launch
    raises DDPError (DDPTimeout on timeout) after all output was shown. ``cell_label`` names
    the source in tracebacks and stacks (``%%ddp`` gives "Cell In[N]"; by default the copy in
    the launch's log folder). Bad input raises DDPUsageError before anything starts.
    """
    spec = rules.given_or_made(spec, n, options, shape=pool.spec if pool is not None else None)
    if not isinstance(target, str) and not callable(target):
        raise TypeError(f"nbddp.run needs source text or a callable, got {type(target).__name__}")
    _check_arguments(args, kwargs, cwd, env_base, push, cell_label)
    func = None if isinstance(target, str) else target
    kind = rules.choose_source(spec, pool=None if pool is None else pool.spec,
                               pool_ready=pool is None or pool.ready, why_broken=getattr(pool, "why_broken", ""),
                               func=func is not None, push=bool(push), args=bool(args or kwargs),
                               own_env=cwd is not None or env_base is not None)
    if kind == "pool" and spec.timeout is None and pool.cell_timeout is not None:
        spec = replace(spec, timeout=pool.cell_timeout)  # the pool's --timeout, for every cell
    source = target if func is None else None
    if source is not None:
        rules.check_cell(source)
    if spec.export:
        from nbddp import export

        export.export_source(spec.export, source, spec)
    if sinks is None:
        sinks = choose.make_sinks(spec, shell)
    folder = diffing.new_folder() if spec.diff else None
    launch = Launch(spec, source=source, func=None if func is None else local.pack_callable(func, args, kwargs),
                    sinks=tuple(sinks), cwd=os.path.abspath(cwd or os.getcwd()),
                    env_base=dict(os.environ if env_base is None else env_base), push=push,
                    cell_label=cell_label, traceback_theme=tracebacktheme.theme(shell), pool=pool,
                    diff_folder=folder)
    try:
        result = SOURCES[kind](launch)
        if folder is not None:
            result.diff = diffing.collect(folder, spec.world_size, f"--diff {','.join(spec.diff)}",
                                          failed=[r.rank for r in result.ranks if not r.ok])
            if sinks:  # after the ranks' output
                print(result.diff, flush=True)
    finally:
        if folder is not None:
            diffing.done(folder)
    if check:
        result.raise_for_status()
    return result


def _check_arguments(args, kwargs, cwd, env_base, push, cell_label) -> None:
    """run()'s own arguments, each of the type it must have (DDPUsageError, not a TypeError from
    inside a launch)."""
    def refuse(name, takes, value):
        raise DDPUsageError(f"nbddp.run: {name}= takes {takes}, got {values.shown(value)}")

    if not isinstance(args, (tuple, list)):
        refuse("args", "a tuple of arguments", args)
    if kwargs is not None and not (isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)):
        refuse("kwargs", "a dict of keyword arguments", kwargs)
    if push is not None and not (isinstance(push, dict) and all(isinstance(k, str) and k.isidentifier()
                                                                for k in push)):
        refuse("push", "a dict of Python names to values", push)
    if env_base is not None and not (isinstance(env_base, dict) and all(
            isinstance(k, str) and isinstance(v, str) and "\0" not in k + v and "=" not in k and k
            for k, v in env_base.items())):
        refuse("env_base", "a dict of environment variables (text to text)", env_base)
    if cell_label is not None and not isinstance(cell_label, str):
        refuse("cell_label", "text", cell_label)
    if cwd is not None:
        if not isinstance(cwd, (str, os.PathLike)):
            refuse("cwd", "a folder", cwd)
        if not os.path.isdir(cwd):
            refuse("cwd", "a folder that exists", cwd)
