"""Whether this process is in the private network it was to enter (nbddp/forkserver/privnet.py):
the forkserver records it as it starts (entered, or why it could not), everything it forks
inherits the record, and a rank reads it before it runs anything (private fails closed: a rank
of a forkserver that could not enter refuses to run). The store host reports it to the kernel
(nbddp/forkserver/storehost.py). Plain stdlib, on the rank side, so a rank need not import the
forkserver's modules."""
from __future__ import annotations

_state: dict[str, str] = {}


def entered() -> None:
    """This process entered the private network (privnet.enter)."""
    _state["entered"] = "1"


def is_private() -> bool:
    """This process (or the forkserver it was forked from) entered a private network."""
    return bool(_state.get("entered"))


def failed(why: str) -> None:
    """This process was to enter a private network and could not (``why``); what it forks
    inherits the record (``failure``) and refuses to run as if it had."""
    _state["failed"] = why or "it could not enter one"


def failure() -> str:
    """Why this process (or the forkserver it was forked from) is not in the private network it
    was to enter; "" where it is, or was not asked to."""
    return _state.get("failed", "")
