"""One launch's lifecycle, whatever runs its processes: start, pump events, the clock (timeout, idle
warning, escalation), fail-fast, interrupt, drain, cleanup, and the registry of live launches that
the kernel's exit empties. As in torch's elastic PContext, the processes sit behind one small
interface (``Source``) and report what happened as data (``source.result``); *when* to signal
them is decided here, once. States: NEW → STARTING → RUNNING → (STOPPING) → CLOSING → DONE. While
the supervisor holds a launch, SIGINT only sets a flag the loop reads, so an interrupt never lands
mid-start, mid-reap or mid-close: what was started is ended, no internal error escapes, and the
launch always leaves the registry."""
from __future__ import annotations

import atexit
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any

from nbddp.core import diagnosis
from nbddp.core.cellnames import name_cell
from nbddp.core.result import RunResult
from nbddp.core.states import LaunchState, StopReason
from nbddp.core.summary import label
from nbddp.forkserver import privnet
from nbddp.kernel.inputbox import InputBox
from nbddp.sources import stacks
from nbddp.sources.asking import Asking

NEW, STARTING, RUNNING, STOPPING, CLOSING, DONE = LaunchState

TERM_GRACE_S = 2.0       # fail-fast and timeout: SIGTERM, then SIGKILL after this (as torchrun)
INTERRUPT_GRACE_S = 1.0  # interrupt: SIGINT, then SIGTERM after this for ranks not in a handler,
KILL_AFTER_S = 1.5       # and SIGKILL at this: the stop button ends every rank within 2 s,
HANDLER_LIMIT_S = 30.0   # except ranks running the cell's except/finally (torchrun waits 30 s)
TICK_S = 0.1             # how often the clock runs (and views flush)

_live_lock = threading.Lock()
_live: list = []


def live() -> list:
    """The sources with processes running now (launches in flight, started pools)."""
    with _live_lock:
        return list(_live)


def register(source) -> None:
    with _live_lock:
        if source not in _live:
            _live.append(source)


def unregister(source) -> None:
    with _live_lock:
        if source in _live:
            _live.remove(source)


@atexit.register
def _kill_all_live() -> None:
    """At kernel exit: end every process still running (before multiprocess joins its children)."""
    for source in live():
        source.kill_now()


class Source:
    """The processes of one launch, as the supervisor sees them. Subclasses start and reap
    processes and keep ``result`` (a RunResult) true; they never decide when to stop."""

    # the first signal for each reason to stop; the supervisor escalates from there
    FIRST_SIGNAL = {StopReason.FAILFAST: signal.SIGTERM, StopReason.TIMEOUT: signal.SIGTERM,
                    StopReason.INTERRUPT: signal.SIGINT}
    persistent = False  # a pool outlives its cells: it leaves the registry when it is stopped

    @property
    def interrupted_note(self) -> str:
        """The note for the interrupt (a class attribute in the sources that say more)."""
        return "interrupted: all ranks were stopped"

    result: RunResult | None = None
    cell_path = ""
    cell_label: str | None = None  # how stacks name cell_path's frames (nbddp/core/cellnames.py)
    source_text: str | None = None

    _listener = None  # the supervisor's emit, from ``start`` until the launch has ended

    def emit(self, event: str, *args) -> None:
        """Report ``event`` (one of nbddp/core/sink.py's) to the sinks of the launch running
        now; outside a launch (a pool between cells) nothing listens."""
        if self._listener is not None:
            self._listener(event, *args)

    def note(self, text: str) -> None:
        self.result.notes.append(text)
        self.emit("note", text)

    def start(self, emit) -> None:
        """Start the processes, reporting what happens to ``emit(event, *args)`` (the
        supervisor's) until ``detach``. As torch's PContext.start: the work is ``_start``."""
        self._listener = emit
        self._start()

    def detach(self) -> None:
        """The launch is over: its sinks hear nothing more (a pool's ranks outlive the cell)."""
        self._listener = None

    def _start(self) -> None:
        """Start the processes. Whatever it started must be known to ``kill_now``/``close``
        even when it fails half-way."""

    def busy(self) -> bool:
        """True while the launch runs (torch: ``_poll()`` returned None)."""
        raise NotImplementedError

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` for output, messages and exits, and handle them."""
        raise NotImplementedError

    def failure(self) -> str | None:
        """Why the others must be stopped now (fail-fast), e.g. 'after rank 1 failed'."""
        return None

    def signal(self, sig: int, reason: str, why: str, spare_handlers: bool = False) -> None:
        """Send ``sig`` to every live process; with ``spare_handlers``, not to ranks running
        the cell's own interrupt handler (they acknowledged SIGINT)."""
        raise NotImplementedError

    def end_lingering(self, limit: float) -> None:
        """End ranks whose cell finished ``limit`` s ago but whose process has not exited."""

    def handling(self) -> list[int]:
        """Ranks still running their interrupt handler (except KeyboardInterrupt / finally)."""
        return []

    def kill_now(self) -> None:
        """SIGKILL everything at once (kernel exit, a second interrupt). Safe at any time."""
        raise NotImplementedError

    def asking_ranks(self):
        """The ranks' prompts (input(), pdb; nbddp/sources/rankprocs.py's RankProcs), or None
        where ranks cannot ask the notebook (torchrun's)."""
        return None

    def stack_targets(self) -> list:
        """(RankResult, pid, stack file) of the ranks to ask where they are."""
        return []

    def close(self) -> None:
        """Reap, drain what is left in the pipes (bounded), release everything."""

    def finish(self) -> None:
        """Give every rank its final state (after ``close``)."""


class Supervisor:
    """Runs one launch of ``source`` to its end: ``Supervisor(source, spec).run()`` → RunResult."""

    def __init__(self, source: Source, spec, sinks=()):
        self.source = source
        self.spec = spec
        self.sinks = list(sinks)
        self.state = NEW
        self.stopping: str | None = None   # failfast | timeout | interrupt
        self.escalations: list[tuple[float, int, bool]] = []
        self.interrupts = 0                 # SIGINTs seen (the loop acts on them)
        self.handled_interrupts = 0
        self.handler_noted = False
        self.last_output = time.monotonic()
        self.idle_warned = False
        self.asking = Asking(source, self.emit)  # the ranks' prompts (input(), pdb), one at a time
        self.asked_s = 0.0                  # time spent at (or waiting for) a prompt: the user's
        self.clock_at = time.monotonic()
        self.began: float | None = None     # the launch's started_at, on the monotonic clock

    # ----------------------------------------------------------------- public
    def run(self):
        """Start, pump until every process has ended, close; the RunResult (or what start raised)."""
        try:
            return self._run()
        finally:
            self.source.detach()

    def _run(self):
        source = self.source
        error = None
        with self._sigint_as_flag():
            self.interrupts += take_sigint_early()  # came before the launch began
            register(source)
            try:
                self.state = STARTING
                try:
                    if self.asking.ranks is not None:  # the front end of the cell running now
                        self.asking.box = InputBox.for_this_cell()
                    source.start(self.emit)
                    self.state = RUNNING
                    self.last_output = time.monotonic()
                    self._loop()
                except BaseException as exc:  # raised again once all is ended
                    error = exc  # (a start that failed, or a view that raised)
                    source.kill_now()
                self.state = CLOSING
                source.close()
                if error is None:
                    source.finish()
            finally:
                if not source.persistent or error is not None:
                    unregister(source)
            if error is None:
                self._report()
            self.state = DONE
        if error is not None:
            raise error
        if self.interrupts:  # one that came while the report was shown
            source.result.interrupted = True
        return source.result

    def _report(self) -> None:
        result = self.source.result
        if self.interrupts:  # also one that came as the last rank ended, or while closing
            result.interrupted = True
        if result.interrupted:
            self.source.note(self.source.interrupted_note)
        result.ended_at = time.time()
        diagnosis.add_hints(result, private_net=self.spec.launcher == "local" and privnet.requested())
        if any(getattr(sink, "shows_output", False) for sink in self.sinks):
            result.displayed = [r.rank for r in result.ranks if self.spec.shown(r.rank)]
        self.emit("launch_finished", result)

    # ------------------------------------------------------------------- loop
    def _loop(self) -> None:
        while self.source.busy():
            if self.interrupts > self.handled_interrupts:
                self._on_interrupt()
            self.source.poll(TICK_S if self.stopping is None else 0.05)
            if self.stopping is None:
                self.asking.step()
            self._clock()
            self.emit("tick")  # views flush batched updates here (at most every 0.1 s)

    def _elapsed(self, now: float) -> float:
        """Seconds the launch has run since its ``started_at``, less the user's time at prompts:
        on the monotonic clock, read once against the wall clock (which NTP may slew or step:
        a slewed wall clock makes a timeout come early)."""
        if self.began is None:
            self.began = now - max(0.0, time.time() - self.source.result.started_at)
        return now - self.began - self.asked_s

    def _clock(self) -> None:
        now = time.monotonic()
        due = [e for e in self.escalations if e[0] <= now]
        if due:
            self.escalations = [e for e in self.escalations if e[0] > now]
            for _, sig, spare in due:
                self.source.signal(sig, self.stopping, self.why, spare_handlers=spare)
        if self.stopping == StopReason.INTERRUPT and not self.handler_noted and self.escalations \
                and now >= self.stop_at + KILL_AFTER_S + 0.2:
            busy = self.source.handling()
            if busy:
                self.handler_noted = True
                self.source.note(f"{label(busy)} still running the cell's "
                                 f"interrupt handler (except KeyboardInterrupt / finally); "
                                 f"interrupt again to kill now")
        if self.stopping is not None:
            return
        if self.asking.busy:  # the user's time at a prompt: no fail-fast, timeout or hang report yet
            self.asked_s += now - self.clock_at
            self.clock_at = self.last_output = now
            return
        self.clock_at = now
        spec = self.spec
        # a rank whose cell finished gets --exit-grace to exit (atexit handlers, a final checkpoint in
        # a non-daemon thread), whatever --idle-warning says (the warning shows where it waits)
        self.source.end_lingering(spec.exit_grace)
        why = self.source.failure()
        if why:
            self._stop(StopReason.FAILFAST, why)
        elif spec.timeout is not None and self._elapsed(now) > spec.timeout:
            self._time_out()
        elif (spec.idle_warning and not self.idle_warned
              and now - self.last_output > spec.idle_warning and self.source.stack_targets()):
            self.idle_warned = True
            targets = self._collect_stacks()
            self.source.note(diagnosis.idle_report(now - self.last_output, self.source.result,
                                                   [t[0] for t in targets], spec.timeout))

    # --------------------------------------------------------------- stopping
    def _stop(self, reason: StopReason, why: str) -> None:
        self.stopping, self.why, self.state = reason, why, STOPPING
        self.asking.stop()
        self.stop_at = now = time.monotonic()
        sig = self.source.FIRST_SIGNAL[reason]
        self.source.signal(sig, reason, why)
        if sig == signal.SIGINT:
            self.escalations = [(now + INTERRUPT_GRACE_S, signal.SIGTERM, True),
                                (now + KILL_AFTER_S, signal.SIGKILL, True),
                                (now + HANDLER_LIMIT_S, signal.SIGKILL, False)]
        else:
            self.escalations = [(now + TERM_GRACE_S, signal.SIGKILL, False)]

    def _time_out(self) -> None:
        self._collect_stacks()
        result = self.source.result
        result.timed_out = True
        self.source.note(diagnosis.timeout_report(self.spec.timeout, result))
        self._stop(StopReason.TIMEOUT, f"after the {self.spec.timeout:g} s timeout")

    def _collect_stacks(self) -> list:
        targets = self.source.stack_targets()
        dumps = stacks.ask([(res.rank, pid, path) for res, pid, path in targets])
        for res, _, _ in targets:
            text = dumps.get(res.rank)
            if text is not None:
                res.stack = name_cell(text, self.source.cell_path, self.source.cell_label, self.source.source_text)
                res.blocked_at = diagnosis.blocked_at(text, self.source.cell_path, self.source.source_text)
        return targets

    def _on_interrupt(self) -> None:
        first = self.handled_interrupts == 0
        self.handled_interrupts = self.interrupts
        self.source.result.interrupted = True
        if first and self.stopping != StopReason.INTERRUPT:
            self.escalations = []
            self._stop(StopReason.INTERRUPT, "after the interrupt")
        else:  # a second interrupt: no more grace
            self.escalations = []
            self.source.kill_now()

    def _sigint_as_flag(self):
        def on_sigint(signum, frame):
            self.interrupts += 1

        return sigint_deferred(on_sigint)

    # --------------------------------------------------------------- emitting
    def emit(self, event: str, *args) -> None:
        if event == "output":
            self.last_output = time.monotonic()
            self.idle_warned = False
        for sink in self.sinks:
            handler = getattr(sink, event, None)
            if handler is not None:
                handler(*args)


_early: dict[str, Any] = {"count": 0, "previous": None}  # SIGINTs counted; the handler replaced


def _count_early(signum, frame):
    _early["count"] += 1


def count_sigint_from_now():
    """Count SIGINTs from now on, for the next launch to act on (the kernel has taken a
    message; see nbddp/magic.py), and return the handler this replaced. One ``signal()`` call:
    were Python's handler installed first (as ipykernel's own hook does) and ours after, a
    SIGINT between the two would raise KeyboardInterrupt outside any handler's ``try``, where
    ipykernel's event loop takes it for Ctrl-C in a terminal and the kernel exits. ValueError
    off the main thread."""
    _early["count"], _early["previous"] = 0, signal.default_int_handler
    return signal.signal(signal.SIGINT, _count_early)


def take_sigint_early() -> int:
    """The interrupts counted since the kernel took the message (and no more counted)."""
    count, _early["count"] = _early["count"], 0
    return count


def restore_sigint_early() -> int:
    """Python's handler again, where the counting one is installed; returns the interrupts
    counted until then (one that comes after raises KeyboardInterrupt as usual: none is lost)."""
    try:
        if signal.getsignal(signal.SIGINT) is _count_early:
            signal.signal(signal.SIGINT, _early["previous"])
    except ValueError:
        pass
    return take_sigint_early()


@contextmanager
def sigint_deferred(on_sigint):
    """While the block runs, SIGINT calls ``on_sigint`` instead of raising KeyboardInterrupt
    wherever the main thread happens to be (see the module docstring)."""
    try:
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN:  # this process ignores interrupts: so do we
            previous = None
        else:
            signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: no SIGINT is delivered here
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
