"""The Python API under the magic: ``nbddp.run(source_or_callable, n=4, ...)``.

Scripts, tests and other tools use the same engine as ``%%ddp``."""
from __future__ import annotations

import ast

from IPython.core.error import UsageError
import os

from nbddp.core import placement

from nbddp.sources.local import Launch
from nbddp.core.spec import LaunchSpec, make_spec
from nbddp.views.textview import TextView


def run(target, n: int | None = None, *, args=(), kwargs=None, spec: LaunchSpec | None = None,
        sinks=None, check: bool = True, cwd: str | None = None, env_base: dict | None = None,
        push: dict | None = None, cell_label: str | None = None, **options):
    """Run ``target`` (a cell's source text, or a callable) on ranked workers; returns RunResult.

    Options are those of ``%%ddp`` with underscores (``nproc_per_node=2, nnodes=2,
    master_port=29500, timeout=10, env={...}``). With ``check`` (the default) a failed launch
    raises DDPError (DDPTimeout on timeout) after all output was shown. ``cell_label`` names
    the source in tracebacks and stacks (``%%ddp`` gives "Cell In[N]"; by default the copy in
    the launch's log folder).
    """
    if spec is None:
        spec = make_spec(n=n, **options)
    placement.plan(spec, placement.cuda_device_count(), env_base if env_base is not None else dict(os.environ))
    source = func = None
    if isinstance(target, str):
        source = target
        compile_cell(source)
    elif callable(target):
        func = target
    else:
        raise TypeError(f"nbddp.run needs source text or a callable, got {type(target).__name__}")
    if sinks is None:
        sinks = [TextView(spec)]
    launch = Launch(spec, source=source, func=func, args=args, kwargs=kwargs, sinks=sinks,
                    cwd=cwd, base_env=env_base, push=push, cell_label=cell_label)
    result = launch.run()
    if check:
        result.raise_for_status()
    return result


def compile_cell(source: str) -> None:
    """Report the cell's SyntaxError here, once, before any rank starts: as a UsageError, which
    IPython shows as just the message (no frames from inside nbddp or IPython), and which
    still fails the cell for papermill. Line numbers are the notebook cell's."""
    try:
        ast.parse(source, filename="<%%ddp cell>")
    except SyntaxError as exc:
        where = f"cell line {exc.lineno}" if exc.lineno else "the cell"
        text = [f"%%ddp: {where} has a syntax error, so no rank was started:"]
        if exc.text:
            code = exc.text.rstrip("\n")
            text.append("    " + code.strip())
            if exc.offset:
                indent = len(code) - len(code.lstrip())
                text.append("    " + " " * max(0, exc.offset - 1 - indent) + "^")
        text.append(f"SyntaxError: {exc.msg}")
        raise UsageError("\n".join(text)) from None
