"""Inside one rank that torch's elastic launcher started for ``%%ddp --launcher torchrun``.

torchrun runs ``python -m nbddp.rank.torchrun_rank CELL.py ARGS...``; this runs CELL.py exactly as
``python CELL.py ARGS...`` would (``__main__``, ``sys.argv``, tracebacks with the cell's lines)
and leaves a small status file for the kernel: pid and rank when it starts, the exception and
exit code when it ends, the Python stacks on request. Nothing of nbddp stays in the rank's
environment, so the cell sees exactly what torchrun gives a script.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import linecache
import os
import signal
import socket
import sys
import time
import traceback
import types

from nbddp.core import settings
from nbddp.core.cellnames import name_cell
from nbddp.core.exitstates import exit_status
from nbddp.core.rankfiles import RankFiles
from nbddp.rank import cellsource, gpumemory, ipytraceback, nostdin, stackwatch
from nbddp.rank.worker import cell_line

STATUS_DIR_VAR = settings.ELASTIC_DIR  # the internal names: nbddp/core/settings.py
PREFIX_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
LABEL_VAR = settings.ELASTIC_CELL_LABEL  # how tracebacks name the cell (nbddp/core/cellnames.py)
THEME_VAR = settings.ELASTIC_TB_THEME  # the kernel's traceback colours (nbddp/rank/ipytraceback.py)
LEGACY_VAR = settings.ELASTIC_LEGACY_FLAG  # --legacy-launch: the flag torch.distributed.launch passed
SAME_INTERRUPT_S = 1.0  # SIGINTs closer than this are one interrupt (see _acknowledge_sigint)


def _die_with_parent() -> None:
    """If the torchrun agent dies (SIGKILL, OOM), this rank dies too (Linux)."""
    try:
        import ctypes

        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)
    except Exception:
        pass


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _torch_error_file(exc: BaseException, text: str) -> None:
    """The error file torchrun's summary reads (what torch's ``@record`` writes)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        _write(path, {"message": {"message": f"{type(exc).__name__}: {exc}",
                                  "extraInfo": {"py_callstack": text,
                                                "timestamp": str(int(time.time()))}}})
    except OSError:
        pass


def _acknowledge_sigint(path: str) -> None:
    """SIGINT raises KeyboardInterrupt as in any script, after leaving a mark for the kernel:
    Python code got it, so the cell's except/finally are given time (nbddp/sources/supervisor.py).
    One interrupt may come by two routes (Slurm signals every process of a step, and torchrun
    forwards it too; so does a terminal's Ctrl-C): a SIGINT within a second of the last one
    raised is the same interrupt and must not break into the cell's handler."""
    last = [-SAME_INTERRUPT_S]

    def on_sigint(signum, frame):
        now = time.monotonic()
        if now - last[0] < SAME_INTERRUPT_S:
            return
        last[0] = now
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError:
            pass
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def main() -> None:
    status_dir = os.environ.pop(STATUS_DIR_VAR, "")
    os.environ.pop(PREFIX_VAR, None)
    _die_with_parent()
    legacy = os.environ.pop(LEGACY_VAR, "")
    label = os.environ.pop(LABEL_VAR, "") or None
    theme = os.environ.pop(THEME_VAR, "") or None
    cell_path = os.path.abspath(sys.argv[1])
    sys.argv = [cell_path] + ([f"{legacy}={os.environ.get('LOCAL_RANK', '0')}"] if legacy else []) + sys.argv[2:]
    rank = int(os.environ.get("RANK", "0"))
    status = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
              "node_rank": int(os.environ.get("GROUP_RANK", "0")), "pid": os.getpid(),
              "host": socket.gethostname(),
              "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
              "started_at": time.time()}
    status_path = RankFiles(status_dir).status(rank) if status_dir else ""
    if status_path:
        _write(status_path, status)
        stackwatch.serve(RankFiles(status_dir).stacks(rank))
        _acknowledge_sigint(RankFiles(status_dir).sigint(rank))
    faulthandler.enable(file=sys.stderr, all_threads=True)
    nostdin.install()
    source = cellsource.read(cell_path)  # nbddp's copy, not whatever the path names by now
    linecache.cache[cell_path] = (len(source), None, source.splitlines(True), cell_path)
    module = types.ModuleType("__main__")
    module.__file__ = cell_path
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    code = 0
    deferral = contextlib.ExitStack()
    try:
        exec(compile(source, cell_path, "exec"), module.__dict__)
    except SystemExit as exc:
        code = exit_status(exc.code)  # what the process exits with: sys.exit(-9) is 247, not a signal
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
            status["exception"] = {"type": "SystemExit", "message": str(exc.code), "traceback": "",
                                   "cell_line": cell_line(exc.__traceback__, cell_path)}
    except BaseException as exc:  # the user's error, shown as Python would
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        text = name_cell("".join(traceback.format_exception(type(exc), exc, tb)), cell_path, label)
        deferral.enter_context(ipytraceback.deferred_sigterm())  # until the status file says it
        shown = ipytraceback.format_exception(exc, tb, cell_path=cell_path, label=label, theme=theme,
                                              skip_file=__file__)
        sys.stderr.write(shown or text)
        status["exception"] = {"type": type(exc).__name__, "message": str(exc), "traceback": text,
                               "shown": shown, "cell_line": cell_line(tb, cell_path)}
        _torch_error_file(exc, text)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if status_path:
        status["gpu_memory"] = gpumemory.measure()
        status["exitcode"] = code
        status["ended_at"] = time.time()
        try:
            _write(status_path, status)
        except OSError:
            pass
    deferral.close()  # a SIGTERM that came meanwhile ends the rank now
    sys.exit(code)


if __name__ == "__main__":
    main()
