"""torchrun's agent process as the kernel holds it: started in a session of its own (the
kernel's death reaches it by SIGTERM), its stdout and stderr read without blocking, each
``[rankN]:`` line (torchrun's ``--tee 3`` prefix) appended to that rank's log and handed on,
torchrun's own lines kept in ``agent.log`` for diagnosis.

It decides nothing: what a rank's line means is the source's (``on_output``,
nbddp/sources/torchrun.py), when to signal is the supervisor's (nbddp/sources/supervisor.py).
"""
from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time

from nbddp.core.rankfiles import RankFiles
from nbddp.sources import ranklogs

DRAIN_LIMIT_S = 3.0
MAX_AGENT_LINES = 10000  # torchrun's own lines kept in the kernel for the diagnosis
EXIT_WAIT_S = 5.0
PREFIX_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"  # torchrun's line prefix, set to
PREFIX_TEMPLATE = "[rank${rank}]:"
_PREFIX = re.compile(rb"^\[rank(\d+)\]:")  # ... as it reads back


def _agent_preexec() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # the kernel dies → torchrun is told
    except Exception:
        pass


class AgentProcess:
    """One agent process and its output. ``on_output(rank, stream, payload)`` is called for each
    line a rank wrote, after it was appended to ``rank{N}.{stream}`` in ``log_dir``."""

    def __init__(self, log_dir: str, on_output, note=None):
        self.log_dir = log_dir
        self.on_output = on_output
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []  # torchrun's own words (also in agent.log)
        self.budget = ranklogs.LogBudget(note or (lambda text: None))  # the logs' caps (nbddp/sources/ranklogs.py)
        self.logs: dict[tuple[int, str], ranklogs.RankLog] = {}
        self._agent_log: ranklogs.RankLog | None = None
        self.buffers = {"stdout": b"", "stderr": b""}
        self._selector: selectors.DefaultSelector | None = None
        self._streams: dict[int, str] = {}

    @property
    def agent_log(self) -> str:
        return os.path.join(self.log_dir, "agent.log")

    def start(self, cmd: list[str], cwd: str, env: dict) -> None:
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=_agent_preexec)
        self._selector = selectors.DefaultSelector()
        self._streams = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        for fd, stream in self._streams.items():
            os.set_blocking(fd, False)
            self._selector.register(fd, selectors.EVENT_READ, stream)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def signal_group(self, sig: int) -> None:
        """``sig`` to the agent's session (torchrun and whatever did not leave it)."""
        if self.proc is not None:
            killpg(self.proc.pid, sig)

    def group_alive(self) -> bool:
        return self.proc is not None and pg_alive(self.proc.pid)

    # ---------------------------------------------------------------- reading
    def read(self, timeout: float) -> None:
        """Wait up to ``timeout`` for output and hand on every complete line; the logs it went
        to are flushed (someone may be reading them)."""
        got = [self._read_one(key) for key, _ in self._selector.select(timeout=timeout)]  # every one
        if any(got):
            for log in list(self.logs.values()) + [self._agent_log]:
                if log is not None:
                    log.flush(tail=False)

    def _read_one(self, key) -> bool:
        """One read from the agent's pipe; True if it brought output."""
        try:
            data = os.read(key.fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._selector.unregister(key.fd)
            del self._streams[key.fd]
            return False
        self._feed(key.data, data)
        return True

    def _feed(self, stream: str, data: bytes) -> None:
        data = self.buffers[stream] + data
        *lines, self.buffers[stream] = data.split(b"\n")
        for line in lines:
            self._line(stream, line + b"\n")

    def _line(self, stream: str, line: bytes) -> None:
        match = _PREFIX.match(line)
        if match is None:  # torchrun's own words: kept in agent.log, summarised at the end
            text = line.decode("utf-8", errors="replace")
            self.lines.append(text)
            if len(self.lines) > MAX_AGENT_LINES:  # bounded: its first lines and its last (the summary)
                del self.lines[MAX_AGENT_LINES // 10:MAX_AGENT_LINES // 2]
            if self._agent_log is None:
                self._agent_log = ranklogs.RankLog(self.agent_log, self.budget, "torchrun")
            self._agent_log.write(line)
            return
        rank = int(match.group(1))
        payload = line[match.end():]
        log = self.logs.get((rank, stream))
        if log is None:
            log = self.logs[(rank, stream)] = ranklogs.RankLog(RankFiles(self.log_dir).log(rank, stream),
                                                               self.budget, f"rank {rank}")
        log.write(payload)  # (flushed when the agent has said all it had: read())
        self.on_output(rank, stream, payload)

    # ---------------------------------------------------------------- closing
    def finish_reading(self) -> None:
        """Wait (bounded) for the agent to exit, read what is left in its pipes (bounded: a
        process that escaped the session may hold them), and close them."""
        if self.proc is None:
            return
        try:
            self.proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while self._streams and time.monotonic() < deadline:
            self.read(0.05)
        for stream, rest in self.buffers.items():
            if rest:
                self._line(stream, rest + b"\n")
            self.buffers[stream] = b""
        self._selector.close()
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()

    def close_logs(self) -> None:
        for log in list(self.logs.values()) + [self._agent_log]:
            if log is not None:
                log.close()


def killpg(pid: int, sig: int) -> None:
    """``sig`` to ``pid``'s process group, else to ``pid`` (gone already: nothing)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def launched_by(pid: int, var: str, value: str) -> bool:
    """Is ``pid`` a process of this user that nbddp started, one whose environment (as it was
    exec'd: ``/proc/PID/environ``) has ``var=value``? A pid read from a status file is only
    signalled then: a planted file (or a pid reused since) never makes the kernel signal a
    process nbddp did not start."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except (OSError, ValueError, TypeError):
        return False
    return f"{var}={value}".encode() in environ.split(b"\0")


def pg_alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
