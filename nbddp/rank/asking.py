"""Inside a rank: ``input()``, ``sys.stdin.readline()``, ``breakpoint()``, ``pdb.set_trace()`` and
``pdb.post_mortem()`` ask the notebook. The rank sends its prompt on its control pipe (msg.ASK)
and blocks until the line typed in the notebook's input box comes back (msg.ANSWER; the kernel
serves one rank at a time, nbddp/sources/asking.py); where no front end can answer (msg.NO_ANSWER)
``input()`` raises NoStdin. pdb is this rank's: its prompt names the rank (``(Pdb rank 1)``),
Ctrl-C is not swallowed at its prompt, and ``c`` leaves nbddp's SIGINT handler in place.
Imported by worker.py (preloaded in the forkserver): stdlib only."""
from __future__ import annotations

import bdb
import builtins
import io
import itertools
import pdb
import sys
import threading
from typing import Any, NoReturn

from nbddp.core import messages as msg
from nbddp.rank.nostdin import MESSAGE, NoDebugger, NoStdin

NO_DEBUGGER = ("no front end can answer the debugger here (papermill, nbclient, or nbddp.run "
               "outside a notebook): run the cell in a notebook, or remove the breakpoint")


class _NotFirst(Exception):
    """--pdb: another rank failed first and is (or was) in the debugger."""


_STATE: dict[str, Any] = {"ctl": None, "rank": 0, "debugging": 0, "post_mortem": False}
_lock = threading.Lock()
_ids = itertools.count(1)


def install(ctl, rank: int) -> None:
    """From now on this rank's stdin is the notebook's input box, through ``ctl``."""
    _STATE.update(ctl=ctl, rank=rank)
    builtins.input = ask_input
    sys.stdin = NotebookStdin()
    # pdb.set_trace(), pdb.post_mortem() and breakpoint() make one (this rank's pdb module, replaced on purpose)
    pdb.Pdb = RankPdb  # type: ignore[misc]


def ask(prompt: str) -> str:
    """The line typed in the notebook for ``prompt`` (without its newline)."""
    purpose = _purpose()
    shown = prompt if purpose != msg.ASK_INPUT else f"[rank {_STATE['rank']}] {prompt}"
    reply = _request(shown, purpose)
    if reply[0] == msg.ANSWER:
        if reply[2] == "\x04":  # end of input, as ipykernel's input() takes it (leaves pdb's `interact`)
            raise EOFError
        return reply[2]
    if purpose == msg.ASK_INPUT:
        shown = f"input({prompt!r}): " if prompt else "input(): "
        raise NoStdin(shown + MESSAGE)
    _refused(reply)


def _purpose() -> str:
    if not _STATE["debugging"]:
        return msg.ASK_INPUT
    return msg.ASK_POST_MORTEM if _STATE["post_mortem"] else msg.ASK_DEBUGGER


def _take_turn() -> None:
    """Before the debugger shows anything: wait for this rank's turn at the input box (another
    rank may be in the debugger), or fail at once where no one can answer."""
    reply = _request(None, _purpose())
    if reply[0] != msg.ANSWER:
        _refused(reply)


def _refused(reply: tuple[Any, ...]) -> NoReturn:
    if reply[2] == msg.NOT_FIRST:
        raise _NotFirst()
    raise NoDebugger(f"breakpoint(): {NO_DEBUGGER}")


def _request(prompt: str | None, purpose: str) -> tuple[Any, ...]:
    """Send msg.ASK (``prompt`` None: only the turn) and wait for its answer."""
    for stream in (sys.stdout, sys.stderr):  # what came before the prompt is shown before it
        try:
            stream.flush()
        except Exception:
            pass
    with _lock:
        ask_id = next(_ids)
        try:
            _STATE["ctl"].send((msg.ASK, ask_id, prompt, purpose))
            while True:
                reply = _STATE["ctl"].recv()
                if reply[0] in (msg.ANSWER, msg.NO_ANSWER) and reply[1] == ask_id:
                    return reply
        except (EOFError, OSError, AttributeError):  # the kernel is gone (or no pipe at all)
            return (msg.NO_ANSWER, ask_id, msg.NO_FRONTEND)


def ask_input(prompt="") -> str:  # replaces the builtin inside this rank only
    return ask(str(prompt))


class NotebookStdin(io.TextIOBase):
    """sys.stdin: each line read is asked for in the notebook; where no one can answer it is at
    its end, as /dev/null would be."""

    def readable(self) -> bool:
        return True

    # typeshed types io.TextIOBase.readline as str, but checks it against IOBase's bytes too
    def readline(self, size: int = -1) -> str:  # type: ignore[override]
        try:
            return ask("") + "\n"
        except EOFError:
            return ""

    def read(self, size=-1) -> str:
        return self.readline()

    def fileno(self) -> int:
        return 0  # /dev/null: what reads fd 0 itself (a subprocess) sees no input

    def isatty(self) -> bool:
        return False


class RankPdb(pdb.Pdb):
    """pdb for one rank: its prompt names the rank; the stop button ends the rank (not caught
    at the prompt); ``c`` keeps nbddp's SIGINT handler (nosigint)."""

    def __init__(self, completekey="tab", stdin=None, stdout=None, skip=None, nosigint=True, readrc=True):
        super().__init__(completekey, stdin, stdout, skip, nosigint=True, readrc=readrc)
        if self.prompt == "(Pdb) ":
            self.prompt = f"(Pdb rank {_STATE['rank']}) "

    def interaction(self, *args, **kwargs):
        _STATE["debugging"] += 1
        try:
            _take_turn()
            return super().interaction(*args, **kwargs)
        finally:
            _STATE["debugging"] -= 1

    def _cmdloop(self):
        self.cmdloop()  # pdb's own catches KeyboardInterrupt and asks again

    def set_continue(self):
        super().set_continue()
        _left()

    def set_quit(self):
        super().set_quit()
        _left()


def _left() -> None:
    """The user let this rank go (`c`, `q`): another rank may have the input box (`n`, `s`
    keep it: the rank asks again at its next line)."""
    try:
        with _lock:
            _STATE["ctl"].send((msg.LEFT_DEBUGGER,))
    except (OSError, ValueError, AttributeError):
        pass


def post_mortem(tb) -> None:
    """--pdb: the debugger at the frame that raised (traceback ``tb``), if this rank failed
    first and a front end can answer; otherwise nothing (the rank reports its failure as it
    would without --pdb)."""
    if tb is None:
        return
    _STATE["post_mortem"] = True
    try:
        debugger = RankPdb()
        debugger.reset()
        debugger.interaction(None, tb)
    except (_NotFirst, NoDebugger, bdb.BdbQuit):
        pass
    finally:
        _STATE["post_mortem"] = False
        _left()
