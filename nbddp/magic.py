"""The IPython side: ``%%ddp``, ``%ddp_pool`` and ``%ddp_export``. Each parses its line
(nbddp/core/launchrules.py, nbddp/core/linecommands.py), calls the API (nbddp/api.py: ``run``, ``Pool``,
nbddp/export.py), stores the result as ``_ddp``, moves ``--push``/``--pull`` values, and raises: a rank's failure as
DDPError, bad input as IPython's UsageError (one line; the only place nbddp raises it)."""
from __future__ import annotations

import ast
import contextlib
import inspect
from typing import TYPE_CHECKING

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class

from nbddp import api
from nbddp.core.cellnames import cell_label
from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError
from nbddp.core.linecommands import parse_diff_line, parse_export_line, parse_pool_line
from nbddp.core.result import Interrupted
from nbddp.core.spec import LaunchSpec
from nbddp.core.states import PoolState
from nbddp.kernel import allcells, pulling
from nbddp.sources import supervisor

if TYPE_CHECKING:
    from nbddp.pool import Pool  # imported where a pool starts: the extension loads without it


@contextlib.contextmanager
def _shown_as_usage_error():
    """nbddp's DDPUsageError (a ValueError for the Python API) as IPython's UsageError, which
    IPython shows as just the message: no frames from inside nbddp or IPython."""
    try:
        yield
    except DDPUsageError as exc:
        raise UsageError(str(exc)) from None


@magics_class
class DDPMagics(Magics):
    """``%%ddp [options] [-- script args]``: run the cell as a torchrun-style job."""

    pool: Pool | None = None
    last_cell: tuple[str, str] | None = None  # (line, cell) of the last %%ddp cell, for %ddp_export

    @cell_magic
    def ddp(self, line: str, cell: str):
        return self._run(line, cell, magic_line=True)

    @cell_magic
    def ddp_all_cells(self, line: str, cell: str):
        """What ``%ddp_pool start --all-cells`` puts before each cell of code (nbddp/kernel/
        allcells.py): the cell on the pool, as ``%%ddp`` with the pool's options; the notebook
        shows no magic line, so none is counted in the cell's line numbers."""
        if self.pool is None or self.pool.state == PoolState.STOPPED:
            allcells.off(self.shell)
            raise UsageError("%ddp_pool: the pool has stopped, so cells run in the kernel again "
                             "(all-cells off); this cell did not run: run it again to run it here, "
                             "or %ddp_pool start -n N --all-cells")
        return self._run(line, cell, magic_line=False)

    def _run(self, line: str, cell: str, magic_line: bool):
        try:
            with _shown_as_usage_error():
                return self._ddp(line, cell, magic_line)
        except KeyboardInterrupt as exc:  # one line, not a traceback through nbddp
            if isinstance(exc, Interrupted):
                raise
            raise Interrupted("nbddp: interrupted; no rank is running") from None

    def _ddp(self, line: str, cell: str, magic_line: bool = True):
        pool = self.pool if (self.pool is not None and self.pool.state != PoolState.STOPPED) else None
        spec = parse_line(line, shape=pool.spec if pool is not None else None)
        if spec is None:  # -h
            return None
        # The magic's own line stays line 1, so line numbers match what the notebook shows.
        source = f"# %%ddp {line.strip()}\n{cell}" if magic_line else cell
        label = cell_label(getattr(self.shell, "execution_count", None))  # tracebacks say "Cell In[N]"
        try:
            result = api.run(source, spec=spec, pool=pool, shell=self.shell, push=self._pushed(spec),
                             cell_label=label, check=False)
        except DDPUsageError:
            raise  # refused before it started: %ddp_export keeps the last cell that ran
        except BaseException:
            type(self).last_cell = (line, cell)
            raise
        type(self).last_cell = (line, cell)
        self.shell.user_ns["_ddp"] = result
        result.raise_for_status()  # a failed cell pulls nothing: the notebook keeps its values
        self.shell.user_ns.update(pulling.collect(spec.pull, result))
        return None

    @line_cell_magic
    def ddp_export(self, line: str, cell: str | None = None):
        """``%ddp_export script.py [%%ddp options]``: write the last %%ddp cell (or this cell,
        as ``%%ddp_export script.py -n 4``) as a torchrun script and print the torchrun commands.
        ``--slurm`` also writes ``script.sbatch``, ``--ray`` ``script_ray.py`` (a Ray job); given
        alone (or with --partition/--account/--time/--sbatch), they add to the last cell's options
        instead of replacing them."""
        from nbddp import export

        with _shown_as_usage_error():
            last = self.last_cell
            path, options = parse_export_line(line, None if last is None else last[0], with_cell=cell is not None)
            export.export_cell(path, cell if cell is not None else last[1], options)
        return None

    @cell_magic
    def local(self, line: str, cell: str):
        """``%%local``: this cell runs in the kernel while every other runs on the pool
        (``--all-cells``; the transformer drops the line then). Without it, cells run in the
        kernel anyway, and so does this one."""
        if line.strip():
            raise UsageError(f"%%local takes no options, got {line.strip()!r}")
        self.shell.run_cell(cell, store_history=False)

    @line_magic
    def ddp_pool(self, line: str):
        """``%ddp_pool start -n 4 [--all-cells] [options]`` · ``status`` · ``restart [options]`` ·
        ``stop`` · ``all-cells on|off`` (every cell on the pool, as ipyparallel's ``%autopx``)."""
        from nbddp.pool import Pool

        pool = self.pool
        with _shown_as_usage_error():
            order = parse_pool_line(line, exists=pool is not None,
                                    running=pool is not None and pool.state in (PoolState.IDLE, PoolState.BUSY))
            if order.help_only:
                return None
            if order.command == "all-cells":
                self._all_cells(order.all_cells)
                return None
            if order.command == "stop" or order.spec is not None:
                if pool is not None:
                    pool.stop()  # restart with new options, a broken one, or stop
                if order.command == "stop":
                    print("nbddp pool: stopped")
                    self._all_cells(False, quiet=not allcells.is_on())
                    return None
                type(self).pool = Pool(order.spec).start()
            elif order.command == "restart":
                pool.restart()
            print(self.pool.status() if self.pool is not None else "nbddp pool: none started")
            if order.all_cells:
                self._all_cells(True)
        return None

    @line_magic
    def ddp_diff(self, line: str):
        """``%ddp_diff model opt rng``: compare these objects across the pool's ranks (a module's
        parameters and buffers, an optimizer's state and hyperparameters, tensors, dicts and
        lists of them, ``rng``: the ranks' generators) by hash, and name the first entries that
        differ, on which ranks, with their max abs difference against rank 0."""
        pool = self.pool
        with _shown_as_usage_error():
            names = parse_diff_line(line, running=pool is not None and pool.state != PoolState.STOPPED)
            if names is not None:
                print(pool.diff(*names))
        return None

    def _all_cells(self, on: bool | None, quiet: bool = False) -> None:
        if on:
            allcells.on(self.shell)
            print("nbddp pool: every cell now runs on the pool's ranks (a cell that begins with %%local, "
                  "another magic or ! runs in the kernel; %ddp_pool all-cells off ends it)")
        else:
            allcells.off(self.shell)
            if not quiet:
                print("nbddp pool: cells run in the kernel again")

    # ------------------------------------------------------------- helpers
    def _pushed(self, spec: LaunchSpec) -> dict:
        values = {}
        for name in spec.push:
            if name not in self.shell.user_ns:
                raise UsageError(f"%%ddp: --push {name}: no such name in the notebook")
            values[name] = self.shell.user_ns[name]
        return values


def install_interrupt_line(shell) -> None:
    """From the moment the kernel takes a message, the stop button is counted, not raised
    (nbddp.sources.supervisor.count_sigint_from_now); a ``%%ddp`` cell hands the count to its
    launch, which stops its ranks as for any interrupt, so the cell ends in one line however early
    the interrupt came (even before IPython has parsed the cell). Any other cell gets Python's
    handler back, and an interrupt that came before its code began raises KeyboardInterrupt at its
    first line (raised in ipykernel's code instead, it would end the message with no reply).
    After a ``%%ddp`` cell the counting handler stays until ipykernel restores its idle one: an
    interrupt after the launch ended has nothing left to stop."""
    kernel = getattr(shell, "kernel", None)
    original_pre = getattr(kernel, "pre_handler_hook", None)
    original_exec = getattr(kernel, "do_execute", None)
    if original_pre is None or original_exec is None or getattr(original_exec, "_nbddp", False):
        return

    def pre_handler_hook():
        try:  # what ipykernel's hook does (keep the idle handler), with ours in its place
            kernel.saved_sigint_handler = supervisor.count_sigint_from_now()
        except ValueError:
            original_pre()

    async def do_execute(code, *args, **kwargs):
        ours = isinstance(code, str) and (code.lstrip().startswith("%%ddp") or allcells.goes_to_pool(code))
        early = None
        if not ours and supervisor.restore_sigint_early():
            early = _InterruptFirst(shell)
        try:
            reply = original_exec(code, *args, **kwargs)
            if inspect.isawaitable(reply):
                reply = await reply
            return reply
        finally:
            if early is not None:
                early.remove()

    do_execute._nbddp = True  # type: ignore[attr-defined]  # marks nbddp's wrapper (never wrapped twice)
    kernel.pre_handler_hook = pre_handler_hook
    kernel.do_execute = do_execute


class _InterruptFirst(ast.NodeTransformer):
    """One cell's code made into ``raise KeyboardInterrupt`` (the stop button came before it
    began), as IPython's AST transformers run: the interrupt is raised where IPython shows it
    as any cell's, and the kernel replies as usual."""

    def __init__(self, shell):
        self.shell, self.done = shell, False
        shell.ast_transformers.append(self)  # removed by do_execute, not while IPython loops over them

    def visit_Module(self, node):
        if self.done:
            return node
        self.done = True
        raised = ast.Raise(exc=ast.Call(func=ast.Name("KeyboardInterrupt", ast.Load()), args=[], keywords=[]))
        node.body = [ast.copy_location(raised, node.body[0]) if node.body else raised]
        return ast.fix_missing_locations(node)

    def remove(self) -> None:
        if self in self.shell.ast_transformers:
            self.shell.ast_transformers.remove(self)
