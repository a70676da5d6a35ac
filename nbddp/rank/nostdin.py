"""Inside a rank: ``input()`` fails at once, saying why. A rank's stdin is /dev/null (no one
could answer four ranks at once, and the notebook is not a terminal), so a plain input() ended
in a bare ``EOFError: EOF when reading a line``. Still an EOFError, so code that catches it
works as before. Imported by worker.py (preloaded in the forkserver): stdlib only."""
from __future__ import annotations

import builtins

MESSAGE = ("ranks have no stdin, so input() cannot ask for a value; set it in the notebook and "
           "send it with --push NAME, or read it from a file")


class NoStdin(EOFError):
    """input() in a rank."""


def install() -> None:
    def input(prompt=""):  # noqa: A001 - replaces the builtin inside this rank only
        shown = f"input({str(prompt)!r}): " if prompt else "input(): "
        raise NoStdin(shown + MESSAGE)

    builtins.input = input
