"""What a launch tells the code that shows it: the events a sink gets, in order, from the
supervisor (nbddp/sources/supervisor.py) and the source it runs. A sink is any object with
some of these methods (``nbddp.run(..., sinks=[...])`` takes one's own); the supervisor calls
those it has, by name. nbddp's views (nbddp/views/) declare that they implement ``Sink``, and
inherit a no-op for the events they ignore.

Order for one launch: ``launch_started``; then, as they happen, ``rank_started`` (once a rank
runs), ``output``, ``display``, ``note``, ``asking``, ``rank_exited`` (when it ends, with its final
state; a rank torchrun restarts starts again), with ``tick`` about every 0.1 s in between;
``launch_finished`` last, once every process has ended and been reaped. Every call comes on
the thread that runs the launch (the kernel's main thread for the magic).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nbddp.core.result import RankResult, RunResult
    from nbddp.core.spec import LaunchSpec


class Sink(Protocol):
    """Receives one launch's events. Results are shared, live objects: read them, do not keep
    references to change later."""

    shows_output: bool = False
    """True for a sink that puts the ranks' output on screen, so the DDPError need not repeat
    a failed rank's traceback (the result's ``displayed`` then lists the ranks shown)."""

    def launch_started(self, result: RunResult, spec: LaunchSpec, backend: str) -> None:
        """The launch begins: ``result`` (a RunResult with the ranks expected, none started;
        torchrun may renumber them later), its LaunchSpec and the backend picked ("nccl", "gloo")."""
        return None  # each event is a no-op unless a sink implements it (an empty body would be abstract)

    def rank_started(self, rank_result: RankResult) -> None:
        """A rank's process runs (for a pool: the cell was sent to it); ``rank_result.pid`` is set."""
        return None

    def output(self, rank: int, stream: str, data: bytes) -> None:
        """Bytes rank ``rank`` wrote to ``stream`` ("stdout" or "stderr"), as read from its
        pipe: not split into lines, possibly mid-character; the full log is on disk."""
        return None

    def display(self, rank: int, bundle: dict[str, Any]) -> None:
        """A mime bundle from ``display()`` / ``plt.show()`` in rank ``rank``."""
        return None

    def note(self, text: str) -> None:
        """One line nbddp has to say (a placement note, an idle warning with the stacks, the
        interrupt); also kept in ``result.notes``."""
        return None

    def asking(self, rank: int | None, waiting: list[int], purpose: str | None) -> None:
        """Rank ``rank`` waits at a prompt in the notebook's input box (None: no rank does now);
        ``purpose``: "debugger", "post-mortem" or "input" (nbddp/core/messages.py); ``waiting``:
        the ranks that asked too and wait their turn (nbddp/sources/asking.py)."""
        return None

    def tick(self) -> None:
        """The supervisor's clock (about every 0.1 s while the launch runs): flush batched updates."""
        return None

    def rank_exited(self, rank_result: RankResult) -> None:
        """A rank ended; its ``state``, ``exitcode`` and ``cause`` are final."""
        return None

    def launch_finished(self, result: RunResult) -> None:
        """Every process has ended and ``result`` is complete (notes, hints, ``displayed``)."""
        return None
