"""The ranks' prompts during one launch (``input()``, ``breakpoint()``, ``pdb``, ``--pdb``), served
one rank at a time through the notebook's input box (nbddp/kernel/inputbox.py). Each turn of the
supervisor's loop calls ``step``: prompts (msg.ASK) queue, the front rank gets the box once its
earlier output is shown, the line goes back to it only (msg.ANSWER); with no front end to answer,
each is refused at once (msg.NO_ANSWER). A debugger asks for its turn first (an ASK without a
prompt); ``--pdb`` debugs the first rank to fail only (a later one gets NOT_FIRST). While a
prompt is open or queued (``busy``) the supervisor pauses fail-fast, --timeout, the idle warning
and the hang report."""
from __future__ import annotations

import time

from nbddp.core import messages as msg

SETTLE_S = 0.5  # the view says "no one in the debugger" only after this long without a prompt
# (a pdb `n` closes the prompt and opens the next a few milliseconds later)
HOLD_S = 2.0    # a rank in the debugger keeps the input box between its prompts (`n`, `s`) until
# its user lets it go (`c`, `q`), unless it has not asked again for this long while others wait:
# a `n` over a collective that waits for a rank queued here would otherwise wait forever


class Asking:
    """The prompts of one launch of ``source``; ``box``: the input box (None: no front end
    can answer), set by the supervisor as the launch starts."""

    def __init__(self, source, emit, box=None):
        self.ranks = getattr(source, "asking_ranks", lambda: None)()
        self.box, self.emit = box, emit
        self.queue: list[tuple] = []      # (rank, ask id, prompt, purpose), oldest first
        self.open: tuple | None = None    # the one in the input box now
        self.holder: int | None = None    # the rank in the debugger, between its prompts too
        self.purpose: str | None = None   # what the last prompt opened was for
        self.held_at = 0.0                # when the holder's last prompt was answered
        self.post_mortem_rank: int | None = None  # --pdb: the first rank to fail
        self.shown: tuple = (None, ())    # what the view was last told: (rank, waiting)
        self.closed_at = 0.0

    @property
    def busy(self) -> bool:
        return self.open is not None or bool(self.queue) or self.holder is not None

    def step(self) -> None:
        """Take new prompts, pass on an answer that came, open the next prompt. Never waits."""
        if self.ranks is None:
            return
        for entry in self.ranks.take_asked():
            if entry[3] == msg.LEFT_DEBUGGER:
                if entry[0] == self.holder:
                    self.holder = None
            else:
                self.queue.append(entry)
        if self.holder is not None and self.open is None and (
                not self.ranks.waits_for_answer(self.holder)
                or (self.queue and time.monotonic() - self.held_at > HOLD_S
                    and all(q[0] != self.holder for q in self.queue))):
            self.holder = None  # it ended, or runs on (after `n`) while others wait
        if self.open is not None:
            rank, ask_id = self.open[0], self.open[1]
            if not self.ranks.waits_for_answer(rank):  # it ended (or was ended) at its prompt
                self._close()
            else:
                line = self.box.answer()
                if line is not None:
                    self._close()
                    self.ranks.answer(rank, (msg.ANSWER, ask_id, line))
                    self.held_at = time.monotonic()
        while self.open is None and self.queue:
            if not self._open_next():
                break
        self._tell_view()

    def stop(self) -> None:
        """The launch stops: nothing more is answered (the ranks are being signalled)."""
        self.queue, self.holder = [], None
        if self.open is not None:
            self._close()
        self._tell_view(now=True)

    # ------------------------------------------------------------------ inner
    def _open_next(self) -> bool:
        """Open the next prompt (the holder's first); False while the holder runs between prompts."""
        held = [q for q in self.queue if q[0] == self.holder]
        if self.holder is not None and not held:
            return False
        entry = held[0] if held else self.queue[0]
        self.queue.remove(entry)
        rank, ask_id, prompt, purpose = entry
        if not self.ranks.waits_for_answer(rank):
            return True
        if self.box is None:
            self.ranks.answer(rank, (msg.NO_ANSWER, ask_id, msg.NO_FRONTEND))
            return True
        if purpose == msg.ASK_POST_MORTEM:
            if self.post_mortem_rank not in (None, rank):
                self.ranks.answer(rank, (msg.NO_ANSWER, ask_id, msg.NOT_FIRST))
                return True
            self.post_mortem_rank = rank
        if purpose != msg.ASK_INPUT:
            self.holder, self.held_at = rank, time.monotonic()
        if prompt is None:  # its debugger's turn: it shows where it stopped, then asks
            self.purpose = purpose
            self.ranks.answer(rank, (msg.ANSWER, ask_id, ""))
            return True
        self.ranks.drain_rank(rank)  # its pdb listing, then its prompt
        self.open, self.purpose = (rank, ask_id, prompt, purpose), purpose
        self._tell_view(now=True)
        self.emit("tick")  # views flush before the input box shows
        self.box.ask(prompt)
        return True

    def _close(self) -> None:
        self.box.cancel()
        self.open = None
        self.closed_at = time.monotonic()

    def _tell_view(self, now: bool = False) -> None:
        rank = self.open[0] if self.open is not None else self.holder
        waiting = tuple(sorted({q[0] for q in self.queue} - {rank}))
        state = (rank, waiting)
        if state == self.shown:
            return
        if rank is None and not waiting and not now and time.monotonic() - self.closed_at < SETTLE_S:
            return
        self.shown = state
        purpose = self.open[3] if self.open is not None else self.purpose
        self.emit("asking", rank, list(waiting), purpose)
