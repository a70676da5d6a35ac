"""The Ray actor ``--launcher ray`` places on each node: starts that node's torchrun and hands its
output back to the driver in whole lines. torchrun gets default signal dispositions (a Ray worker
ignores SIGINT, which exec keeps) and is killed when the actor dies, however it dies (PDEATHSIG; its
ranks die with it). Each method returns within ``READ_WAIT_S``, so a signal queued behind a read
is sent soon; the actor runs one method at a time on its main thread, the one that forked."""
from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys

READ_WAIT_S = 0.2
UNBUFFERED = "-u"  # torchrun copies the ranks' lines to its stdout, a pipe here: line by line, not in blocks
MAX_CHUNK = 1 << 20
RUN_MODULE = "torch.distributed.run"


def _torchrun_preexec() -> None:  # in the child between fork and exec
    os.setsid()
    # a Ray worker ignores SIGINT (the driver's Ctrl-C is not its own) and the ignoring survives
    # exec: torchrun and its ranks get every signal as under a shell
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG: the actor dies → so does it
    except Exception:
        pass


class NodeAgent:
    """One node's torchrun, started and watched from inside a Ray actor (made remote by the driver)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.selector = None
        self.buffers: dict[str, bytes] = {}
        self.written: list[str] = []

    def node(self) -> dict:
        """Where this actor runs: the node's address (the rendezvous host for node 0) and name."""
        import ray

        return {"ip": ray.util.get_node_ip_address(), "host": socket.gethostname(), "pid": os.getpid()}

    def free_port(self) -> int:
        """A port free on this node now, for the rendezvous store torchrun's node 0 hosts."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, argv: list[str], env: dict, cwd: str, files: dict, dirs: list) -> int:
        """torchrun with ``argv`` (after ``python -m torch.distributed.run``), in this node's
        environment plus ``env``; ``files`` (the cell's copies) written where this node lacks them."""
        for folder in dirs:
            os.makedirs(folder, exist_ok=True)
        for path, text in files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path):
                with open(path, "w", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
                    f.write(text)
                self.written.append(path)
        full = dict(os.environ)
        full.update(env)
        self.proc = subprocess.Popen([sys.executable, UNBUFFERED, "-m", RUN_MODULE] + list(argv), env=full,
                                     cwd=cwd if os.path.isdir(cwd) else None, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=_torchrun_preexec)
        self.selector = selectors.DefaultSelector()
        for pipe, stream in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe.fileno(), selectors.EVENT_READ, stream)
            self.buffers[stream] = b""
        return self.proc.pid

    def read(self) -> tuple[bytes, bytes, int | None]:
        """The whole lines torchrun wrote since the last call (waiting up to READ_WAIT_S for
        some), and its exit code once it has ended and said everything."""
        if self.proc is None:
            return b"", b"", None
        out = {"stdout": b"", "stderr": b""}
        ended = not self.selector.get_map()
        for key, _ in ([] if ended else self.selector.select(timeout=READ_WAIT_S)):
            try:
                data = os.read(key.fd, MAX_CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self.selector.unregister(key.fd)
                out[key.data] += self.buffers[key.data]
                self.buffers[key.data] = b""
                continue
            data = self.buffers[key.data] + data
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) > MAX_CHUNK:
                cut = len(data)
            out[key.data] += data[:cut]
            self.buffers[key.data] = data[cut:]
        rc = self.proc.poll() if not self.selector.get_map() else None
        if rc is None and not self.selector.get_map():
            try:
                rc = self.proc.wait(READ_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        return out["stdout"], out["stderr"], rc

    def signal(self, sig: int) -> None:
        """``sig`` to torchrun's session (SIGINT: torchrun's own shutdown of its ranks)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, wait_s: float) -> int | None:
        """torchrun's session ended (SIGTERM, then SIGKILL after ``wait_s``), the cell's copies
        this actor wrote removed; torchrun's exit code."""
        rc = None
        if self.proc is not None:
            self.signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                rc = self.proc.wait(5)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # anything left in its session
            except (ProcessLookupError, PermissionError):
                pass
        for path in self.written:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.written = []
        return rc
