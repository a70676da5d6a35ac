"""The ranks' prompts during one launch (``input()``, ``breakpoint()``, ``pdb``, ``--pdb``), served
one rank at a time through the notebook's input box (nbddp/kernel/inputbox.py).

Each turn of the supervisor's loop calls ``step``: prompts that came (msg.ASK) join a queue; the
rank at the front gets the input box once what it wrote before asking is shown; the line typed
goes back to that rank only (msg.ANSWER). The others wait their turn, each named in the view.
Where no front end can answer, every prompt is refused at once (msg.NO_ANSWER: the rank's
``input()`` raises NoStdin as it always did). ``--pdb`` debugs the first rank to fail only: a
later post-mortem is refused (NOT_FIRST) and that rank reports its failure as without --pdb.

While a prompt is open or queued (``busy``) the time is the user's: the supervisor pauses
fail-fast, --timeout, the idle warning and the hang report.
"""
from __future__ import annotations

import time

from nbddp.core import messages as msg

SETTLE_S = 0.5  # the view says "no one in the debugger" only after this long without a prompt
# (a pdb `n` closes the prompt and opens the next a few milliseconds later)


class Asking:
    """The prompts of one launch of ``source``; ``box``: the input box (None: no front end
    can answer), set by the supervisor as the launch starts."""

    def __init__(self, source, emit, box=None):
        self.ranks = getattr(source, "asking_ranks", lambda: None)()
        self.box, self.emit = box, emit
        self.queue: list[tuple] = []      # (rank, ask id, prompt, purpose), oldest first
        self.open: tuple | None = None    # the one in the input box now
        self.post_mortem_taken = False
        self.shown: tuple = (None, ())    # what the view was last told: (rank, waiting)
        self.closed_at = 0.0

    @property
    def busy(self) -> bool:
        return self.open is not None or bool(self.queue)

    def step(self) -> None:
        """Take new prompts, pass on an answer that came, open the next prompt. Never waits."""
        if self.ranks is None:
            return
        self.queue += self.ranks.take_asked()
        if self.open is not None:
            rank, ask_id = self.open[0], self.open[1]
            if not self.ranks.waits_for_answer(rank):  # it ended (or was ended) at its prompt
                self._close()
            else:
                line = self.box.answer()
                if line is not None:
                    self._close()
                    self.ranks.answer(rank, (msg.ANSWER, ask_id, line))
        while self.open is None and self.queue:
            self._open_next()
        self._tell_view()

    def stop(self) -> None:
        """The launch stops: nothing more is answered (the ranks are being signalled)."""
        self.queue = []
        if self.open is not None:
            self._close()
        self._tell_view(now=True)

    # ------------------------------------------------------------------ inner
    def _open_next(self) -> None:
        rank, ask_id, prompt, purpose = self.queue.pop(0)
        if not self.ranks.waits_for_answer(rank):
            return
        if self.box is None:
            self.ranks.answer(rank, (msg.NO_ANSWER, ask_id, msg.NO_FRONTEND))
            return
        if purpose == msg.ASK_POST_MORTEM:
            if self.post_mortem_taken:
                self.ranks.answer(rank, (msg.NO_ANSWER, ask_id, msg.NOT_FIRST))
                return
            self.post_mortem_taken = True
        self.ranks.drain_rank(rank)  # its pdb listing, then its prompt
        self.open = (rank, ask_id, prompt, purpose)
        self._tell_view(now=True)
        self.emit("tick")  # views flush before the input box shows
        self.box.ask(prompt)

    def _close(self) -> None:
        self.box.cancel()
        self.open = None
        self.closed_at = time.monotonic()

    def _tell_view(self, now: bool = False) -> None:
        rank = self.open[0] if self.open is not None else None
        waiting = tuple(sorted({q[0] for q in self.queue} - {rank}))
        state = (rank, waiting)
        if state == self.shown:
            return
        if rank is None and not waiting and not now and time.monotonic() - self.closed_at < SETTLE_S:
            return
        self.shown = state
        purpose = self.open[3] if self.open is not None else None
        self.emit("asking", rank, list(waiting), purpose)
