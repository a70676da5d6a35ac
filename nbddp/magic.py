"""The IPython side: ``%%ddp`` and ``%ddp_pool``. Parses the line, checks the cell, picks a view,
runs the cell (fresh job, or on the running pool), stores the result as ``_ddp``, moves
``--push``/``--pull`` values, and raises if any rank failed."""
from __future__ import annotations

import inspect
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class

from nbddp import api
from nbddp.kernel import pulling
from nbddp.sources import supervisor
from nbddp.views.choose import make_sinks
from nbddp.core.cellnames import cell_label
from nbddp.core.result import Interrupted
from nbddp.core.spec import LaunchSpec, parse_line
from nbddp.core.states import PoolState

# Options that shape a job: a cell on a running pool cannot change them.
_SHAPE_FIELDS = ("nproc_per_node", "nnodes", "master_addr", "master_port", "backend", "env",
                 "legacy_launch", "start_method", "script_args", "launcher", "gpus")
_POOL_USAGE = "usage: %ddp_pool start [%%ddp launch options] | status | restart | stop"


_SLURM_JOB_FLAGS = ("--slurm", "--partition", "--account", "--time", "--sbatch")


def _only_slurm_job_options(words: list[str]) -> bool:
    """True for options that only shape the exported Slurm job (not the cell's ranks)."""
    i = 0
    while i < len(words):
        flag = words[i].split("=", 1)[0]
        if flag not in _SLURM_JOB_FLAGS:
            return False
        i += 1 if (flag == "--slurm" or "=" in words[i]) else 2
    return bool(words)


@magics_class
class DDPMagics(Magics):
    """``%%ddp [options] [-- script args]``: run the cell as a torchrun-style job."""

    pool = None

    @cell_magic
    def ddp(self, line: str, cell: str):
        try:
            return self._ddp(line, cell)
        except KeyboardInterrupt as exc:  # one line, not a traceback through nbddp
            if isinstance(exc, Interrupted):
                raise
            raise Interrupted("nbddp: interrupted; no rank is running") from None

    def _ddp(self, line: str, cell: str):
        pool = self.pool if (self.pool is not None and self.pool.state != PoolState.STOPPED) else None
        spec = parse_line(line, shape=pool.spec if pool is not None else None)
        if spec is None:  # -h
            return None
        # The magic's own line stays line 1, so line numbers match what the notebook shows.
        source = f"# %%ddp {line.strip()}\n{cell}"
        label = cell_label(getattr(self.shell, "execution_count", None))  # tracebacks say "Cell In[N]"
        api.compile_cell(source)
        push = self._pushed(spec)
        type(self).last_cell = (line, cell)  # for %ddp_export
        if spec.slurm and not spec.export:
            raise UsageError("%%ddp: --slurm writes a Slurm job next to the exported script: "
                             "use it with --export SCRIPT.py (or %ddp_export SCRIPT.py --slurm)")
        if spec.export:
            from nbddp import export
            export.export_cell(spec.export, cell, line, spec)
        if spec.launcher == "torchrun":  # torch's elastic launcher runs the cell (nbddp/sources/torchrun.py)
            from nbddp.sources import torchrun
            result = torchrun.run_cell(source, spec, sinks=make_sinks(spec, self.shell), cell_label=label)
        elif spec.launcher == "slurm":  # srun runs torchrun on each node of an allocation (nbddp/sources/slurm.py)
            from nbddp.sources import slurm
            result = slurm.run_cell(source, spec, sinks=make_sinks(spec, self.shell))
        elif pool is not None and not spec.fresh:
            self._check_fits_pool(spec, pool.spec)
            result = pool.run(source, ranks=spec.ranks_shown, timeout=spec.timeout, push=push,
                              pull=[name.split("@")[0] for name in spec.pull],
                              sinks=make_sinks(spec, self.shell), check=False, cell_label=label)
        else:
            result = api.run(source, spec=spec, sinks=make_sinks(spec, self.shell),
                             check=False, push=push, cell_label=label)
        self.shell.user_ns["_ddp"] = result
        self._check_pull_ranks(spec, result)
        result.raise_for_status()  # a failed cell pulls nothing: the notebook keeps its values
        self.shell.user_ns.update(pulling.collect(spec.pull, result))
        return None

    last_cell = None

    @line_cell_magic
    def ddp_export(self, line: str, cell: str | None = None):
        """``%ddp_export script.py [%%ddp options]``: write the last %%ddp cell (or this cell,
        as ``%%ddp_export script.py -n 4``) as a torchrun script and print the torchrun commands.
        ``--slurm`` also writes ``script.sbatch``; given alone (with --partition/--account/--time/
        --sbatch), it adds to the last cell's options instead of replacing them."""
        from nbddp import export

        words = shlex.split(line)
        if not words:
            raise UsageError("%ddp_export: usage: %ddp_export SCRIPT.py [%%ddp options]")
        path, options = words[0], shlex.join(words[1:])
        if cell is None:
            if self.last_cell is None:
                raise UsageError("%ddp_export: no %%ddp cell has run yet; run one, or use "
                                 "%%ddp_export SCRIPT.py [options] with the cell below")
            last_line, cell = self.last_cell
            if not options or _only_slurm_job_options(words[1:]):  # "%ddp_export x.py --slurm": the last
                last = shlex.split(last_line)                      # cell's line, plus the job's options
                cut = last.index("--") if "--" in last else len(last)
                options = shlex.join(last[:cut] + words[1:] + last[cut:])
        export.export_cell(path, cell, options)
        return None

    @line_magic
    def ddp_pool(self, line: str):
        """``%ddp_pool start -n 4 [options]`` · ``status`` · ``restart`` · ``stop``."""
        from nbddp.sources.pool import Pool

        words = shlex.split(line)
        if not words:
            raise UsageError(f"%ddp_pool: {_POOL_USAGE}")
        command, rest = words[0], " ".join(shlex.quote(w) for w in words[1:])
        if command == "start":
            if self.pool is not None and self.pool.state in ("ready", "running a cell"):
                raise UsageError("%ddp_pool: a pool is already running; %ddp_pool stop it first, "
                                 "or %ddp_pool restart")
            spec = parse_line(rest)
            if spec is None:
                return None
            if self.pool is not None:
                self.pool.stop()  # a broken one: release what is left of it
            if spec.launcher != "local":
                raise UsageError("%ddp_pool: a pool runs on the local launcher only")
            type(self).pool = Pool(spec).start()
            print(self.pool.status())
        elif command == "status":
            print(self.pool.status() if self.pool is not None else "nbddp pool: none started")
        elif command == "restart":
            if self.pool is None:
                raise UsageError("%ddp_pool: no pool to restart; %ddp_pool start -n N")
            if rest:
                spec = parse_line(rest)
                self.pool.stop()
                type(self).pool = Pool(spec).start()
            else:
                self.pool.restart()
            print(self.pool.status())
        elif command == "stop":
            if self.pool is not None:
                self.pool.stop()
            print("nbddp pool: stopped")
        else:
            raise UsageError(f"%ddp_pool: unknown command {command!r}; {_POOL_USAGE}")
        return None

    # ------------------------------------------------------------- helpers
    def _pushed(self, spec: LaunchSpec) -> dict:
        values = {}
        for name in spec.push:
            if name not in self.shell.user_ns:
                raise UsageError(f"%%ddp: --push {name}: no such name in the notebook")
            values[name] = self.shell.user_ns[name]
        return values

    @staticmethod
    def _check_pull_ranks(spec: LaunchSpec, result) -> None:
        for item in spec.pull:
            name, _, rank = item.partition("@")
            if rank and not 0 <= int(rank) < result.world_size:
                raise UsageError(f"%%ddp: --pull {item}: rank {rank} outside 0..{result.world_size - 1}")

    @staticmethod
    def _check_fits_pool(spec: LaunchSpec, pool_spec: LaunchSpec) -> None:
        default = LaunchSpec()
        for field in _SHAPE_FIELDS:
            value = getattr(spec, field)
            if value != getattr(default, field) and value != getattr(pool_spec, field):
                raise UsageError(f"%%ddp: a pool of {pool_spec.world_size} ranks is running, so "
                                 f"--{field.replace('_', '-')} cannot change here; use --fresh for a "
                                 f"separate job, or %ddp_pool restart with new options")



def install_interrupt_line(shell) -> None:
    """From the moment the kernel takes a message, the stop button is counted, not raised
    (nbddp.sources.supervisor.defer_sigint_early); a ``%%ddp`` cell hands the count to its launch, which
    stops its ranks as for any interrupt, so the cell ends in one line however early the
    interrupt came (even before IPython has parsed the cell). Any other cell gets its interrupt
    back at once as Python's own KeyboardInterrupt."""
    kernel = getattr(shell, "kernel", None)
    original_pre = getattr(kernel, "pre_handler_hook", None)
    original_exec = getattr(kernel, "do_execute", None)
    if original_pre is None or original_exec is None or getattr(original_exec, "_nbddp", False):
        return

    def pre_handler_hook():
        original_pre()
        supervisor.defer_sigint_early()

    async def do_execute(code, *args, **kwargs):
        ours = isinstance(code, str) and code.lstrip().startswith("%%ddp")
        if not ours:
            supervisor.restore_sigint_early(redeliver=True)
        try:
            reply = original_exec(code, *args, **kwargs)
            if inspect.isawaitable(reply):
                reply = await reply
            return reply
        finally:
            if ours:
                supervisor.restore_sigint_early()

    do_execute._nbddp = True
    kernel.pre_handler_hook = pre_handler_hook
    kernel.do_execute = do_execute
