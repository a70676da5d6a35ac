"""Inside a rank that no one can answer: ``input()`` fails at once, saying why, and so does the
debugger. nbddp's own ranks ask the notebook instead (nbddp/rank/asking.py) and fail this way
only where no front end can answer; torchrun's ranks (nbddp/rank/torchrun_rank.py) have no way
back to the notebook at all, so there ``install`` makes both fail. Still an EOFError for
``input()``, so code that catches that works unchanged. Stdlib (and nbddp.core.errors) only."""
from __future__ import annotations

import builtins

from nbddp.core.errors import NbddpError

MESSAGE = ("ranks have no stdin, so input() cannot ask for a value; set it in the notebook and "
           "send it with --push NAME, or read it from a file")
TORCHRUN_DEBUGGER = ("the debugger reaches the notebook from nbddp's own ranks only; a rank of "
                     "--launcher torchrun has no way back to it: run the cell without --launcher "
                     "torchrun to debug it there")


class NoStdin(EOFError, NbddpError):
    """input() in a rank."""


class NoDebugger(RuntimeError, NbddpError):
    """breakpoint() / pdb where no one can answer; not an EOFError, so pdb's loop does not take
    it for the user's ``EOF`` (which would quit as if ``q`` had been typed)."""


def install() -> None:
    """input() and the debugger fail at once, naming the cause (a torchrun rank)."""
    import pdb

    def input(prompt=""):  # replaces the builtin inside this rank only
        shown = f"input({str(prompt)!r}): " if prompt else "input(): "
        raise NoStdin(shown + MESSAGE)

    class NoPdb(pdb.Pdb):
        def interaction(self, *args, **kwargs):
            raise NoDebugger(f"breakpoint(): {TORCHRUN_DEBUGGER}")

    builtins.input = input
    pdb.Pdb = NoPdb  # type: ignore[misc]  # this rank's pdb module, replaced on purpose
