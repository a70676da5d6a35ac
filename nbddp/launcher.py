"""Process plumbing for one launch: start the ranks, pump their output to the views, watch
them end, fail fast, time out, handle interrupts, and leave nothing running.

Everything runs in the caller's (the kernel's) main thread: the cell blocks until all ranks
have ended, so output arrives while the cell is executing, as nbclient and papermill need.
"""
from __future__ import annotations

import atexit
import os
import pickle
import selectors
import signal
import sys
import threading
import time
import uuid

from . import diagnosis, placement, pushing, spares, stacks, starter
from .logdirs import new_log_dir, private
from .envvars import legacy_argv, rank_env
from .rendezvous import host_store
from .result import (FAILED, INTERRUPTED, KILLED, OK, RUNNING, TERMINATED, TIMED_OUT, RankResult,
                     RunResult)
from .spec import LaunchSpec

READ_CHUNK = 1 << 16
TERM_GRACE_S = 2.0       # after SIGTERM, before SIGKILL (fail-fast and timeout)
INTERRUPT_GRACE_S = 1.0  # the stop button must end everything within 2 s
DRAIN_LIMIT_S = 2.0      # waiting for pipes held open by something that escaped the group

_live_lock = threading.Lock()
_live: set["Launch"] = set()


def _kill_all_live() -> None:
    """At kernel exit: end every rank still running (before multiprocess joins its children)."""
    with _live_lock:
        launches = list(_live)
    for launch in launches:
        launch.kill_now()


atexit.register(_kill_all_live)


class _Rank:
    """The launcher's handle on one live rank."""

    def __init__(self, result: RankResult):
        self.result = result
        self.process = None
        self.fds: dict[int, tuple[str, object]] = {}
        self.ctl = None
        self.lifeline_w: int | None = None
        self.logs: dict[str, object] = {}
        self.started = False   # setsid done: the pid is also the process group id
        self.alive = False
        self.stopped_by_us: str | None = None
        self.stack_path = ""


class Launch:
    """One launch of ``spec``: ``Launch(spec, source=...).run()`` returns a RunResult."""

    def __init__(self, spec: LaunchSpec, *, source: str | None = None, func=None, args=(),
                 kwargs=None, sinks=(), cwd: str | None = None, base_env: dict | None = None,
                 push: dict | None = None):
        if (source is None) == (func is None):
            raise TypeError("give exactly one of source or func")
        self.spec = spec
        self.source = source
        self.func = None if func is None else pack_callable(func, args, kwargs)
        self.push = pushing.pack(push)  # one shared file, read by every rank
        self.sinks = list(sinks)
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.ranks: list[_Rank] = []
        self.selector = selectors.DefaultSelector()
        self.failing: str | None = None
        self.kill_deadline: float | None = None
        self.last_output = time.monotonic()
        self.idle_warned = False
        self.result: RunResult | None = None
        self.pool_mode = False  # a Pool's ranks serve many cells over a duplex control pipe
        self.use_spares = False  # ranks forked ahead of need (nbddp/spares.py)

    # ----------------------------------------------------------------- public
    def run(self) -> RunResult:
        spec = self.spec
        log_dir = new_log_dir(spec.log_dir)
        cell_path = os.path.join(log_dir, "cell.py")
        with open(cell_path, "w", opener=private) as f:
            f.write(self.source if self.source is not None else
                    f"# nbddp ran the function {self.func['name']}\n")
        store, port = host_store(spec.master_addr, spec.master_port)
        plan = placement.plan(spec, placement.cuda_device_count(), self.base_env)
        backend = plan.backend
        run_id = str(uuid.uuid4())
        self.result = RunResult(
            ranks=[RankResult(rank=r, local_rank=spec.local_rank_of(r), node_rank=spec.node_of(r))
                   for r in range(spec.world_size)],
            world_size=spec.world_size, log_dir=log_dir, master_port=port, started_at=time.time())
        self._emit("launch_started", self.result, spec, backend)
        if plan.note:
            self._note(plan.note)
        with _live_lock:
            _live.add(self)
        try:
            try:
                self._start_all(cell_path, port, run_id, backend, log_dir)
                self._pump()
            except KeyboardInterrupt:
                self._interrupt()
        finally:
            self._cleanup()
            with _live_lock:
                _live.discard(self)
            pushing.discard(self.push)
            del store
        self.result.ended_at = time.time()
        diagnosis.add_hints(self.result)
        self._emit("launch_finished", self.result)
        if self.use_spares and not self.result.interrupted:
            spares.refill(len(self.ranks))  # for the next cell, while the user reads this one
        return self.result

    def kill_now(self) -> None:
        """SIGKILL every rank's process group at once (kernel exit, second interrupt)."""
        for rank in self.ranks:
            if rank.alive:
                self._signal(rank, signal.SIGKILL)

    # ---------------------------------------------------------------- startup
    def _start_all(self, cell_path, port, run_id, backend, log_dir) -> None:
        spec = self.spec
        ctx = starter.context(spec.start_method)
        self.use_spares = spares.usable(spec, self.pool_mode)
        ready = spares.take(len(self.result.ranks)) if self.use_spares else []
        prepared = []  # everything made first, then all ranks started at once (starter.start_all)
        for i, res in enumerate(self.result.ranks):
            rank = _Rank(res)
            self.ranks.append(rank)
            r = res.rank
            res.stdout_path = os.path.join(log_dir, f"rank{r}.stdout")
            res.stderr_path = os.path.join(log_dir, f"rank{r}.stderr")
            rank.stack_path = os.path.join(log_dir, f"rank{r}.stacks")
            rank.logs = {"stdout": open(res.stdout_path, "wb", opener=private),
                         "stderr": open(res.stderr_path, "wb", opener=private)}
            plumbing = ready[i] if i < len(ready) else spares.Plumbing(ctx, duplex=self.pool_mode)
            env = rank_env(spec, r, master_port=port, run_id=run_id,
                           error_file=os.path.join(log_dir, f"rank{r}.error.json"),
                           base_env=self.base_env)
            # One stdlib pickle, sent over the rank's job pipe: multiprocess would pickle it with
            # dill (pure Python, ~3 ms a rank), and a spare forked earlier gets it the same way.
            plain = pickle.dumps({
                "rank": r, "env": env, "cwd": self.cwd, "sys_path": list(sys.path),
                "argv": [cell_path] + legacy_argv(spec, r) + list(spec.script_args),
                "cell_path": cell_path, "source": self.source, "func": self.func,
                "stack_path": rank.stack_path,
                "pull": [name.split("@")[0] for name in spec.pull], "backend": backend, "push": self.push,
                "pool": self.pool_mode,
            }, protocol=pickle.HIGHEST_PROTOCOL)
            rank.process, rank.ctl, rank.lifeline_w = plumbing.process, plumbing.ctl, plumbing.life_w
            prepared.append((rank, plumbing, plain))
        for rank, plumbing, plain in prepared[:len(ready)]:  # spares begin while the rest fork
            plumbing.send_job(plain)
            self._watch(rank, plumbing.out_r, plumbing.err_r)
        fresh = prepared[len(ready):]
        try:
            starter.start_all([plumbing.process for _, plumbing, _ in fresh])
        finally:  # also after a failed start: the started ranks are watched (and ended by cleanup)
            for rank, plumbing, plain in fresh:
                plumbing.close_child_ends()
                if not plumbing.started:
                    plumbing.discard()
                    rank.ctl = rank.lifeline_w = None
                    continue
                plumbing.send_job(plain)
                self._watch(rank, plumbing.out_r, plumbing.err_r)

    def _watch(self, rank: _Rank, out_r: int, err_r: int) -> None:
        """A started rank: its pipes and exit go into the selector."""
        res, process = rank.result, rank.process
        rank.alive = True
        res.pid, res.state, res.started_at = process.pid, RUNNING, time.time()
        rank.fds = {out_r: ("stdout", None), err_r: ("stderr", None)}
        for fd, (stream, _) in rank.fds.items():
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, ("out", rank, stream))
        self.selector.register(rank.ctl.fileno(), selectors.EVENT_READ, ("ctl", rank, None))
        self.selector.register(process.sentinel, selectors.EVENT_READ, ("exit", rank, None))
        self._emit("rank_started", res)

    # ------------------------------------------------------------------- loop
    def _busy(self) -> bool:
        """Keep pumping while this is true: a launch runs until every rank has ended."""
        return any(rank.alive for rank in self.ranks)

    def _pump(self) -> None:
        while self._busy():
            for key, _ in self.selector.select(timeout=0.1):
                kind, rank, stream = key.data
                if kind == "out":
                    self._read_output(key.fd, rank, stream)
                elif kind == "ctl":
                    self._read_ctl(rank)
                else:
                    self._on_exit(rank)
            self._check_clock()
            self._emit("tick")  # views flush batched updates here (at most every 0.1 s)

    def _read_output(self, fd: int, rank: _Rank, stream: str) -> bool:
        """Read one chunk; False when nothing was there (or the pipe closed)."""
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(fd)
            os.close(fd)
            del rank.fds[fd]
            return False
        self.last_output = time.monotonic()
        self.idle_warned = False
        rank.logs[stream].write(data)
        self._emit("output", rank.result.rank, stream, data)
        return True

    def _read_ctl(self, rank: _Rank) -> None:
        conn = rank.ctl
        if conn is None:
            return
        try:
            while conn.poll(0):
                self._on_message(rank, conn.recv())
        except (EOFError, OSError):
            self.selector.unregister(conn.fileno())
            conn.close()
            rank.ctl = None
        except Exception as exc:  # a message that cannot be unpickled here
            self._note(f"rank {rank.result.rank}: could not read a message from the worker: {exc}")

    def _on_message(self, rank: _Rank, message) -> None:
        kind = message[0]
        res = rank.result
        if kind == "started":
            rank.started = True
        elif kind == "exception":
            res.exception = message[1]
        elif kind == "return":
            res.value = message[1]
        elif kind == "pulled":
            res.pulled.update(message[1])
            res.pull_errors.update(message[2] if len(message) > 2 else {})
        elif kind == "return_error":
            self._note(f"rank {res.rank}: {message[1]}")
        elif kind == "display":
            self._emit("display", res.rank, message[1])

    def _on_exit(self, rank: _Rank) -> None:
        process = rank.process
        self.selector.unregister(process.sentinel)
        process.join(5)
        code = process.exitcode
        rank.alive = False
        if rank.started:  # sweep whatever the rank started and left behind
            self._signal(rank, signal.SIGKILL, group_only=True)
        self._read_ctl(rank)
        res = rank.result
        res.exitcode, res.ended_at = code, time.time()
        if rank.stopped_by_us and code != 0:
            res.state = TIMED_OUT if rank.stopped_by_us == "timeout" else (
                INTERRUPTED if rank.stopped_by_us == "interrupt" else TERMINATED)
            if res.state == TERMINATED:
                res.cause = f"stopped by nbddp {self.failing}"
            elif res.state == INTERRUPTED:
                res.cause = "stopped by the interrupt"
        elif code == 0:
            res.state = OK
        else:
            if code is not None and code < 0:
                res.state, res.cause = KILLED, diagnosis.describe_signal(-code)
            else:
                res.state = FAILED
                res.cause = diagnosis.describe_failure(res.exception, code)
            if self.failing is None:
                self._stop_others(f"after rank {res.rank} failed", "failfast", TERM_GRACE_S)
        self._emit("rank_exited", res)

    def _check_clock(self) -> None:
        now = time.monotonic()
        if self.kill_deadline is not None and now >= self.kill_deadline:
            self.kill_now()
            self.kill_deadline = None
        spec = self.spec
        if (spec.timeout is not None and self.failing is None
                and time.time() - self.result.started_at > spec.timeout):
            self._time_out()
            return
        if (spec.idle_warning and not self.idle_warned and self.failing is None
                and now - self.last_output > spec.idle_warning):
            self.idle_warned = True
            self._idle_warning(now - self.last_output)

    # ------------------------------------------------------------- stopping
    def _stop_others(self, why: str, reason: str, grace: float) -> None:
        self.failing = why
        for rank in self.ranks:
            if rank.alive and rank.stopped_by_us is None:
                rank.stopped_by_us = reason
                self._signal(rank, signal.SIGTERM)
        self.kill_deadline = time.monotonic() + grace

    def _signal(self, rank: _Rank, sig: int, group_only: bool = False) -> None:
        pid = rank.process.pid if rank.process is not None else None
        if pid is None:
            return
        try:
            if rank.started:
                os.killpg(pid, sig)
            elif not group_only:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _collect_stacks(self, ranks) -> None:
        """Ask each live rank for its Python stacks (faulthandler on SIGUSR1) and keep them."""
        dumps = stacks.ask([(rank, rank.process.pid, rank.stack_path)
                            for rank in ranks if rank.alive and rank.started])
        cell_path = os.path.join(self.result.log_dir, "cell.py")
        for rank, text in dumps.items():
            rank.result.stack = text
            rank.result.blocked_at = diagnosis.blocked_at(text, cell_path, self.source)

    def _time_out(self) -> None:
        live = [r for r in self.ranks if r.alive]
        self._collect_stacks(live)
        self.result.timed_out = True
        self._note(diagnosis.timeout_report(self.spec.timeout, self.result))
        self._stop_others(f"after the {self.spec.timeout:g} s timeout", "timeout", TERM_GRACE_S)

    def _idle_warning(self, idle_s: float) -> None:
        live = [r for r in self.ranks if r.alive]
        self._collect_stacks(live)
        self._note(diagnosis.idle_report(idle_s, self.result, [r.result for r in live]))

    def _interrupt(self) -> None:
        self.result.interrupted = True
        self._stop_others("after the interrupt", "interrupt", INTERRUPT_GRACE_S)
        deadline = time.monotonic() + INTERRUPT_GRACE_S + 0.5
        while any(r.alive for r in self.ranks):
            try:
                for key, _ in self.selector.select(timeout=0.05):
                    kind, rank, stream = key.data
                    if kind == "out":
                        self._read_output(key.fd, rank, stream)
                    elif kind == "ctl":
                        self._read_ctl(rank)
                    else:
                        self._on_exit(rank)
                self._check_clock()
                if time.monotonic() > deadline:
                    self.kill_now()
            except KeyboardInterrupt:  # a second interrupt: no more grace
                self.kill_now()
        self._note("interrupted: all ranks were stopped")

    def _cleanup(self) -> None:
        """Reap every rank, drain what is left in the pipes, close everything."""
        for rank in self.ranks:
            if rank.alive:
                self._signal(rank, signal.SIGKILL)
                rank.process.join(5)
                self._on_exit(rank)
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while any(rank.fds for rank in self.ranks) and time.monotonic() < deadline:
            for key, _ in self.selector.select(timeout=0.05):
                kind, rank, stream = key.data
                if kind == "out":
                    self._read_output(key.fd, rank, stream)
                elif kind == "ctl":
                    self._read_ctl(rank)
        for rank in self.ranks:
            for fd in list(rank.fds):
                self.selector.unregister(fd)
                os.close(fd)
            rank.fds.clear()
            if rank.ctl is not None:
                self._read_ctl(rank)
                if rank.ctl is not None:
                    self.selector.unregister(rank.ctl.fileno())
                    rank.ctl.close()
                    rank.ctl = None
            if rank.lifeline_w is not None:
                os.close(rank.lifeline_w)
                rank.lifeline_w = None
            for log in rank.logs.values():
                log.close()
            if rank.process is not None:
                rank.process.close()
        self.selector.close()

    # ------------------------------------------------------------- emitting
    def _note(self, text: str) -> None:
        self.result.notes.append(text)
        self._emit("note", text)

    def _emit(self, event: str, *args) -> None:
        for sink in self.sinks:
            handler = getattr(sink, event, None)
            if handler is not None:
                handler(*args)


def pack_callable(func, args=(), kwargs=None) -> dict:
    """Serialize a callable (with the notebook globals it uses) once, in the kernel, so a
    function that cannot be sent fails here with its name, not inside four ranks."""
    import dill
    import linecache

    try:
        payload = dill.dumps((func, tuple(args), dict(kwargs or {})), recurse=True)
    except Exception as exc:
        raise TypeError(f"nbddp: cannot send {getattr(func, '__qualname__', func)!r} and its "
                        f"arguments to the ranks: {exc}") from None
    code = getattr(func, "__code__", None)
    filename = code.co_filename if code is not None else None
    lines = linecache.getlines(filename) if filename else []
    return {"payload": payload, "name": getattr(func, "__qualname__", repr(func)),
            "filename": filename, "lines": lines}
