"""The Supervisor's state machine, driven through a Source of the test's own (no kernel, no
processes): each state, an interrupt in each, the timeout, fail-fast, escalation, and the
events its sinks get. The real sources (ForkRanks, PoolRanks, ElasticLaunch) are exercised
by the kernel tests; here the supervisor's own decisions are pinned down, in about a second."""
from __future__ import annotations

import signal
import time

import pytest

from nbddp.core.result import FAILED, INTERRUPTED, KILLED, OK, RUNNING, TERMINATED, TIMED_OUT, RankResult, RunResult
from nbddp.core.sink import Sink
from nbddp.core.spec import LaunchSpec
from nbddp.sources import supervisor
from nbddp.sources.supervisor import Source, Supervisor

GIVE_UP_S = 5.0  # a supervisor that never ends the fake ranks fails the test instead of hanging it
ENDED_BY = {"failfast": TERMINATED, "timeout": TIMED_OUT, "interrupt": INTERRUPTED}


class FakeRanks(Source):
    """``n`` ranks that exist only in this object. Each runs until the test's ``plan`` (poll
    number → action) ends it, or a signal it does not ``ignore`` arrives; ranks in ``handlers``
    are running the cell's interrupt handler (spared by escalations that spare handlers).
    Every call the supervisor makes is recorded with the supervisor's state at that moment."""

    interrupted_note = "interrupted: the fake ranks were stopped"

    def __init__(self, n: int = 2, plan=None, ignore=(), handlers=(), on_start=None, on_close=None):
        self.result = RunResult(ranks=[RankResult(rank=r, local_rank=r, node_rank=0) for r in range(n)],
                                world_size=n, log_dir="/nonexistent")
        self.plan = dict(plan or {})
        self.ignore = set(ignore)
        self.handlers = set(handlers)
        self.on_start, self.on_close = on_start, on_close
        self.alive: set[int] = set()
        self.polls = 0
        self.calls: list[tuple] = []
        self.sup: Supervisor | None = None
        self.t0 = time.monotonic()

    def _record(self, name: str, *args) -> None:
        self.calls.append((name, str(self.sup.state), time.monotonic() - self.t0) + args)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def signals(self) -> list[tuple]:
        """(state, signal, reason, spare_handlers) of each signal the supervisor sent."""
        return [(c[1], c[3], c[4], c[5]) for c in self.calls if c[0] == "signal"]

    # the actions a plan can take
    def output(self, rank: int, text: str) -> None:
        self.emit("output", rank, "stdout", text.encode())

    def exit(self, rank: int, code: int) -> None:
        self._end(rank, code, OK if code == 0 else FAILED if code > 0 else KILLED)

    def sigint(self) -> None:
        signal.raise_signal(signal.SIGINT)  # what the stop button does to the kernel

    def _end(self, rank: int, code: int, state: str) -> None:
        if rank not in self.alive:
            return
        res = self.result.ranks[rank]
        res.exitcode, res.state, res.ended_at = code, state, time.time()
        self.alive.discard(rank)
        self.emit("rank_exited", res)

    # ------------------------------------------------------------------ Source
    def _start(self) -> None:
        self._record("start")
        self.result.started_at = time.time()
        self.emit("launch_started", self.result, self.sup.spec, "gloo")
        for res in self.result.ranks:
            res.state, res.pid, res.started_at = RUNNING, 1000 + res.rank, time.time()
            self.alive.add(res.rank)
            self.emit("rank_started", res)
        if self.on_start is not None:
            self.on_start(self)

    def busy(self) -> bool:
        return bool(self.alive)

    def poll(self, timeout: float) -> None:
        if time.monotonic() - self.t0 > GIVE_UP_S:  # raised to the test, after the supervisor's cleanup
            raise AssertionError(f"the supervisor did not end the ranks in {GIVE_UP_S} s: {self.calls}")
        self.polls += 1
        if self.polls == 1:
            self._record("poll", signal.getsignal(signal.SIGINT))
        time.sleep(min(timeout, 0.002))
        action = self.plan.pop(self.polls, None)
        if action is not None:
            action(self)

    def failure(self) -> str | None:
        bad = next((r for r in self.result.ranks if r.state == FAILED), None)
        return None if bad is None or not self.alive else f"after rank {bad.rank} failed"

    def signal(self, sig: int, reason: str, why: str, spare_handlers: bool = False) -> None:
        self._record("signal", sig, reason, spare_handlers)
        if sig in self.ignore and sig != signal.SIGKILL:
            return
        for rank in sorted(self.alive):
            if not (spare_handlers and rank in self.handlers):
                self._end(rank, -sig, ENDED_BY[reason] if sig != signal.SIGKILL else KILLED)

    def handling(self) -> list[int]:
        return sorted(self.handlers & self.alive)

    def kill_now(self) -> None:
        self._record("kill_now")
        for rank in sorted(self.alive):
            self._end(rank, -signal.SIGKILL, KILLED)

    def close(self) -> None:
        self._record("close")
        if self.on_close is not None:
            self.on_close(self)

    def finish(self) -> None:
        self._record("finish")


class Recorder(Sink):
    """A sink that writes down each event's name (and the note texts)."""

    def __init__(self):
        self.events: list[str] = []
        self.notes: list[str] = []

    def launch_started(self, result, spec, backend):
        self.events.append("launch_started")

    def rank_started(self, rank_result):
        self.events.append(f"rank_started {rank_result.rank}")

    def output(self, rank, stream, data):
        self.events.append(f"output {rank} {data.decode()!r}")

    def display(self, rank, bundle):
        self.events.append(f"display {rank}")

    def note(self, text):
        self.events.append("note")
        self.notes.append(text)

    def tick(self):
        self.events.append("tick")

    def rank_exited(self, rank_result):
        self.events.append(f"rank_exited {rank_result.rank} {rank_result.state}")

    def launch_finished(self, result):
        self.events.append("launch_finished")

    def without_ticks(self) -> list[str]:
        return [e for e in self.events if e != "tick"]


def run(source: FakeRanks, sinks=(), **spec) -> RunResult:
    spec.setdefault("nproc_per_node", source.result.world_size)
    spec.setdefault("idle_warning", None)
    sup = source.sup = Supervisor(source, LaunchSpec(**spec), sinks)
    return sup.run()


@pytest.fixture(autouse=True)
def _quick(monkeypatch):
    """Escalation steps in tenths of a second instead of seconds (the same order), and SIGINT
    as in a kernel: Python's own handler (a run in the background of a shell ignores it, and
    the supervisor rightly leaves an ignored SIGINT alone)."""
    monkeypatch.setattr(supervisor, "TERM_GRACE_S", 0.2)
    monkeypatch.setattr(supervisor, "INTERRUPT_GRACE_S", 0.1)
    monkeypatch.setattr(supervisor, "KILL_AFTER_S", 0.15)
    monkeypatch.setattr(supervisor, "HANDLER_LIMIT_S", 0.6)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # always given back
    finally:
        signal.signal(signal.SIGINT, before)


# -------------------------------------------------------------------- states
def test_a_launch_that_ends_by_itself_goes_starting_running_closing_done():
    source = FakeRanks(plan={2: lambda s: s.exit(0, 0), 3: lambda s: s.exit(1, 0)})
    result = run(source)
    assert [(c[0], c[1]) for c in source.calls] == [
        ("start", "starting"), ("poll", "running"), ("close", "closing"), ("finish", "closing")]
    assert source.sup.state == "done"
    assert result is source.result and result.ok and not result.interrupted and not result.timed_out
    assert result.ended_at >= result.started_at > 0


def test_sinks_get_the_events_in_order_and_only_while_the_launch_runs():
    rec, other = Recorder(), Recorder()
    only_end = type("OnlyEnd", (), {"seen": [], "launch_finished": lambda self, r: self.seen.append(r)})()
    source = FakeRanks(plan={2: lambda s: s.output(1, "hi\n"), 3: lambda s: s.exit(1, 0),
                             4: lambda s: s.exit(0, 0)})
    source.emit("note", "before the launch")  # nothing listens yet
    result = run(source, [rec, other, only_end])
    assert rec.without_ticks() == ["launch_started", "rank_started 0", "rank_started 1", "output 1 'hi\\n'",
                                   "rank_exited 1 ok", "rank_exited 0 ok", "launch_finished"]
    assert rec.events.count("tick") >= 3 and rec.events == other.events
    assert only_end.seen == [result]  # a sink of one's own needs only the events it wants
    source.emit("note", "after the launch")  # the supervisor has let go of the source
    assert "note" not in rec.events


def test_the_source_is_registered_while_it_runs_and_left_after():
    seen = []
    source = FakeRanks(plan={1: lambda s: seen.append(s in supervisor.live()), 2: lambda s: s.exit(0, 0),
                             3: lambda s: s.exit(1, 0)})
    run(source)
    assert seen == [True] and source not in supervisor.live()


def test_a_persistent_source_stays_registered_until_it_is_stopped():
    source = FakeRanks(plan={1: lambda s: (s.exit(0, 0), s.exit(1, 0))})
    source.persistent = True
    try:
        run(source)
        assert source in supervisor.live()
    finally:
        supervisor.unregister(source)


# ---------------------------------------------------------------- fail-fast
def test_one_failed_rank_stops_the_others():
    source = FakeRanks(n=3, plan={2: lambda s: s.exit(1, 1)})
    result = run(source)
    assert source.signals() == [("stopping", signal.SIGTERM, "failfast", False)]
    assert source.sup.stopping == "failfast"
    assert [r.state for r in result.ranks] == [TERMINATED, FAILED, TERMINATED]
    assert not result.interrupted and not result.timed_out


def test_ranks_that_ignore_sigterm_get_sigkill_after_the_grace():
    source = FakeRanks(plan={2: lambda s: s.exit(0, 1)}, ignore={signal.SIGTERM})
    result = run(source)
    assert source.signals() == [("stopping", signal.SIGTERM, "failfast", False),
                                ("stopping", signal.SIGKILL, "failfast", False)]
    term, kill = [c[2] for c in source.calls if c[0] == "signal"]
    assert 0.2 <= kill - term < 0.2 + 0.5  # TERM_GRACE_S (the upper bound: a loaded machine)
    assert result.ranks[1].state == KILLED


# ------------------------------------------------------------------ timeout
def test_the_timeout_stops_every_rank_and_says_so():
    rec = Recorder()
    source = FakeRanks()  # never ends by itself
    result = run(source, [rec], timeout=0.3)
    assert source.signals() == [("stopping", signal.SIGTERM, "timeout", False)]
    at = next(c[2] for c in source.calls if c[0] == "signal") - next(c[2] for c in source.calls if c[0] == "start")
    assert 0.3 <= at < 0.3 + 0.5
    assert result.timed_out and [r.state for r in result.ranks] == [TIMED_OUT, TIMED_OUT]
    assert any(n.startswith("timed out after 0.3 s") for n in rec.notes), rec.notes
    assert rec.without_ticks().index("note") < rec.without_ticks().index("rank_exited 0 timed out")


# --------------------------------------------------------------- interrupts
def _interrupted(source: FakeRanks, rec: Recorder, result: RunResult) -> None:
    assert result.interrupted and not result.timed_out
    assert rec.notes[-1] == source.interrupted_note
    assert rec.without_ticks()[-2:] == ["note", "launch_finished"]


def test_an_interrupt_while_starting_stops_the_ranks_once_they_have_started():
    rec = Recorder()
    source = FakeRanks(on_start=FakeRanks.sigint)
    result = run(source, [rec])
    assert source.signals() == [("stopping", signal.SIGINT, "interrupt", False)]
    assert source.names()[:2] == ["start", "signal"]  # right after the start, before any poll
    assert [r.state for r in result.ranks] == [INTERRUPTED, INTERRUPTED]
    _interrupted(source, rec, result)


def test_an_interrupt_while_running_sends_sigint_then_escalates():
    rec = Recorder()
    source = FakeRanks(plan={3: FakeRanks.sigint}, ignore={signal.SIGINT, signal.SIGTERM})
    result = run(source, [rec])
    assert source.signals() == [("stopping", signal.SIGINT, "interrupt", False),
                                ("stopping", signal.SIGTERM, "interrupt", True),
                                ("stopping", signal.SIGKILL, "interrupt", True)]
    sigint, sigterm, sigkill = [c[2] for c in source.calls if c[0] == "signal"]
    assert 0.1 <= sigterm - sigint < sigkill - sigint < 0.15 + 0.5 and sigkill - sigint >= 0.15
    _interrupted(source, rec, result)


def test_ranks_running_their_interrupt_handler_get_time_and_a_note():
    rec = Recorder()
    source = FakeRanks(plan={2: FakeRanks.sigint}, ignore={signal.SIGINT}, handlers={1})
    result = run(source, [rec])
    assert [s[1:] for s in source.signals()] == [(signal.SIGINT, "interrupt", False),
                                                 (signal.SIGTERM, "interrupt", True),
                                                 (signal.SIGKILL, "interrupt", True),
                                                 (signal.SIGKILL, "interrupt", False)]
    assert any(n.startswith("rank 1 still running the cell's interrupt handler") for n in rec.notes), rec.notes
    last = [c[2] for c in source.calls if c[0] == "signal"]
    assert 0.6 <= last[-1] - last[0] < 0.6 + 0.5  # HANDLER_LIMIT_S
    assert [r.state for r in result.ranks] == [INTERRUPTED, KILLED]


def test_a_second_interrupt_kills_at_once():
    source = FakeRanks(plan={2: FakeRanks.sigint, 4: FakeRanks.sigint}, ignore={signal.SIGINT})
    result = run(source)
    assert source.signals() == [("stopping", signal.SIGINT, "interrupt", False)]
    assert [c[:2] for c in source.calls if c[0] == "kill_now"] == [("kill_now", "stopping")]
    assert result.interrupted and [r.state for r in result.ranks] == [KILLED, KILLED]


def test_an_interrupt_while_stopping_after_a_failure_becomes_the_interrupt():
    source = FakeRanks(n=3, plan={2: lambda s: s.exit(2, 1), 4: FakeRanks.sigint},
                       ignore={signal.SIGTERM, signal.SIGINT})
    result = run(source)
    assert source.signals()[:2] == [("stopping", signal.SIGTERM, "failfast", False),
                                    ("stopping", signal.SIGINT, "interrupt", False)]
    assert source.sup.stopping == "interrupt" and result.interrupted


def test_an_interrupt_while_closing_marks_the_launch_interrupted():
    rec = Recorder()
    source = FakeRanks(plan={2: lambda s: (s.exit(0, 0), s.exit(1, 0))}, on_close=FakeRanks.sigint)
    result = run(source, [rec])
    assert source.signals() == [] and "finish" in source.names()
    assert [r.state for r in result.ranks] == [OK, OK]
    _interrupted(source, rec, result)


def test_an_interrupt_while_the_result_is_shown_marks_it_interrupted():
    class Slow(Recorder):
        def launch_finished(self, result):
            super().launch_finished(result)
            signal.raise_signal(signal.SIGINT)

    source = FakeRanks(plan={2: lambda s: (s.exit(0, 0), s.exit(1, 0))})
    result = run(source, [Slow()])
    assert result.interrupted and source.signals() == []


def test_an_interrupt_just_before_the_launch_is_acted_on():
    supervisor.count_sigint_from_now()
    try:
        signal.raise_signal(signal.SIGINT)  # the kernel took the cell; the launch has not begun
        source = FakeRanks()
        result = run(source)
    finally:
        supervisor.restore_sigint_early()
    assert source.signals() == [("stopping", signal.SIGINT, "interrupt", False)]
    assert source.polls <= 2 and result.interrupted


def test_sigint_is_only_a_flag_while_the_supervisor_runs():
    source = FakeRanks(plan={1: lambda s: (s.exit(0, 0), s.exit(1, 0))})
    run(source)
    during = next(c[3] for c in source.calls if c[0] == "poll")
    assert during is not signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):  # after the launch: Python's own again
        signal.raise_signal(signal.SIGINT)


# -------------------------------------------------------------------- errors
def test_a_start_that_fails_half_way_ends_what_it_started():
    def fail(source):
        raise RuntimeError("no more descriptors")

    source = FakeRanks(on_start=fail)
    with pytest.raises(RuntimeError, match="no more descriptors"):
        run(source)
    assert source.names() == ["start", "kill_now", "close"]  # no finish: there is no result to settle
    assert [r.state for r in source.result.ranks] == [KILLED, KILLED]
    assert source not in supervisor.live() and source.sup.state == "done"


def test_a_sink_that_raises_ends_the_launch_and_its_error_is_raised():
    class Broken(Recorder):
        def output(self, rank, stream, data):
            raise ValueError("the view broke")

    source = FakeRanks(plan={2: lambda s: s.output(0, "x")})
    with pytest.raises(ValueError, match="the view broke"):
        run(source, [Broken()])
    assert source.names()[-2:] == ["kill_now", "close"] and not source.alive
    assert source not in supervisor.live()


# ------------------------------------------------------- the exit grace (#37.12)
class ExitingRanks(FakeRanks):
    """Fake ranks that write down the limit the supervisor gives ``end_lingering``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.limits: list[float] = []

    def end_lingering(self, limit: float) -> None:
        self.limits.append(limit)


def test_a_rank_in_its_exit_gets_the_exit_grace_not_the_idle_warning():
    """--idle-warning 1 also was the time a rank whose cell ended had to exit (its atexit
    handlers, a final checkpoint): the exit grace is its own setting, 300 s unless given."""
    source = ExitingRanks(plan={3: lambda s: s.exit(0, 0), 4: lambda s: s.exit(1, 0)})
    run(source, idle_warning=1.0)
    assert source.limits and set(source.limits) == {300.0}, source.limits
    source = ExitingRanks(plan={3: lambda s: s.exit(0, 0), 4: lambda s: s.exit(1, 0)})
    run(source, idle_warning=1.0, exit_grace=7.5)
    assert set(source.limits) == {7.5}, source.limits


def test_a_rank_killed_in_its_exit_is_not_ok():
    """The rule the sources apply (nbddp/core/exitstates.py): a rank whose cell ended well and
    that nbddp killed outside any stop (the exit grace ran out) is killed, with why."""
    from nbddp.core.exitstates import settle

    res = RankResult(rank=1, local_rank=1, node_rank=0)
    res.exitcode = 0  # the cell's own code (forkranks keeps it)
    settle(res, None, {signal.SIGKILL})
    assert (res.state, res.exitcode) == (KILLED, -9) and "--exit-grace" in res.cause, res.cause
    res.exitcode = 0
    settle(res, None, set())
    assert res.state == OK
    res.exitcode = 1  # a cell that failed by itself keeps its own failure
    settle(res, None, {signal.SIGKILL})
    assert res.state == FAILED
