"""A real Jupyter kernel for tests, driven over ZMQ with jupyter_client."""
from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import sys
import time
from dataclasses import dataclass, field

import psutil
from jupyter_client import KernelManager

from support.lessons import executed


@dataclass
class Reply:
    """What one executed cell sent back."""

    stdout: str = ""
    stderr: str = ""
    error: dict | None = None
    outputs: list = field(default_factory=list)
    prompts: list = field(default_factory=list)  # the input requests' prompts, in order
    states: list = field(default_factory=list)  # widget states the cell sent (comm_open, comm_msg)
    status: str = ""
    elapsed: float = 0.0

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    @property
    def plain(self) -> str:
        """``text`` without its colours (a rank's traceback is IPython's, coloured)."""
        return plain(self.text)


def plain(text: str) -> str:
    """``text`` without ANSI colour sequences."""
    return ANSI.sub("", text)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Kernel:
    """Start a kernel with this interpreter (or ``python``: another venv's), run cells in it, and
    inspect its processes."""

    def __init__(self, cwd: str | None = None, env: dict | None = None, python: str | None = None, **popen):
        kw = {"cwd": cwd, **popen} if cwd else dict(popen)
        if env is not None:
            kw["env"] = env
        self._sockets = contextlib.ExitStack()  # on unix sockets: no TCP port another process can take first
        self.km = KernelManager(kernel_name="python3", config=self._sockets.enter_context(executed.ipc_kernel()))
        self.km.kernel_spec.argv[0] = python or sys.executable
        self.km.start_kernel(**kw)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def execute(self, code: str, timeout: float = 120, on_output=None, allow_stdin: bool = True) -> Reply:
        """``allow_stdin=False``: as papermill and nbclient run a cell (no input box)."""
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin)
        return self.collect(msg_id, timeout, on_output)

    def converse(self, code: str, answer, timeout: float = 120) -> Reply:
        """Execute ``code`` as a front end with an input box does: each ``input_request`` (as
        ``input()`` in a cell sends) is answered with ``answer(prompt, reply_so_far)``, typed in
        as an ``input_reply`` (None: left unanswered); the prompts are in ``reply.prompts``."""
        msg_id = self.kc.execute(code, allow_stdin=True)
        return self.collect(msg_id, timeout, stdin=answer)

    def _answer_stdin(self, msg_id: str, reply: Reply, answer) -> None:
        try:
            request = self.kc.get_stdin_msg(timeout=0.05)
        except queue.Empty:
            return
        if request["msg_type"] != "input_request" or request["parent_header"].get("msg_id") != msg_id:
            return
        prompt = request["content"]["prompt"]
        reply.prompts.append(prompt)
        line = answer(prompt, reply)
        if line is not None:
            self.kc.input(line)

    def collect(self, msg_id: str, timeout: float = 120, on_output=None, stdin=None) -> Reply:
        reply = Reply()
        start = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                raise TimeoutError(f"cell did not finish in {timeout} s; prompts {reply.prompts}; "
                                   f"so far: {reply.text[-2000:]}")
            if stdin is not None:
                self._answer_stdin(msg_id, reply, stdin)
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 1.0 if stdin is None else 0.05))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    reply.stdout += content["text"]
                else:
                    reply.stderr += content["text"]
                if on_output:
                    on_output(reply)
            elif kind == "error":
                reply.error = content
            elif kind in ("display_data", "execute_result", "update_display_data"):
                reply.outputs.append(content)
            elif kind in ("comm_open", "comm_msg"):
                reply.states.append(content.get("data", {}).get("state", {}))
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply.elapsed = time.monotonic() - start
        while True:   # skip stale replies (wait_for_ready can leave a kernel_info reply behind)
            shell = self.kc.get_shell_msg(timeout=10)
            if shell["parent_header"].get("msg_id") == msg_id:
                break
        reply.status = shell["content"]["status"]
        return reply

    def arm_stack_dump(self, path: str) -> None:
        """Let ``stacks()`` show where the kernel's threads are (faulthandler on SIGUSR2, into
        ``path``): for a test whose cell may get stuck, so its failure says where."""
        self.dump_path = path
        self.ok(f"import faulthandler as _fh, signal as _sig; _fh.register(_sig.SIGUSR2, "
                f"file=open({path!r}, 'w'), all_threads=True)")

    def stacks(self) -> str:
        """The kernel's Python stacks now (after ``arm_stack_dump``), or why there are none."""
        path = getattr(self, "dump_path", None)
        if not path:
            return "(no stack dump armed)"
        try:
            os.kill(self.pid, signal.SIGUSR2)
        except ProcessLookupError:
            return "(the kernel has ended)"
        time.sleep(1.0)
        with open(path) as f:
            return f.read()[-6000:]

    def start_until(self, code: str, done, timeout: float = 60) -> str:
        """Execute ``code`` without waiting for its end: return its stdout so far as soon as
        ``done(stdout)`` holds (the cell runs on)."""
        msg_id = self.kc.execute(code)
        text, deadline = "", time.monotonic() + timeout
        while not done(text):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not there in {timeout} s; so far: {text[-2000:]}")
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                text += msg["content"]["text"]
        return text

    def interrupted_when(self, code: str, when, timeout: float = 60) -> tuple[Reply, float]:
        """Run ``code`` and press the stop button the first time ``when(reply)`` holds for its
        output so far: (its reply, the monotonic time of the interrupt)."""
        msg_id = self.kc.execute(code)
        pressed: list[float] = []

        def on_output(reply):
            if not pressed and when(reply):
                pressed.append(time.monotonic())
                self.km.interrupt_kernel()

        reply = self.collect(msg_id, timeout=timeout, on_output=on_output)
        assert pressed, f"the moment to interrupt never came: {reply.text[-2000:]}"
        return reply, pressed[0]

    def ok(self, code: str, timeout: float = 120) -> Reply:
        """Execute and fail the test with the kernel's own error text if the cell raised."""
        reply = self.execute(code, timeout)
        if reply.status == "error" and not reply.error:  # a UsageError: one line on stderr
            shown = [o.get("data", {}).get("text/plain", "") for o in reply.outputs]
            raise AssertionError(f"cell failed: {reply.text}{' '.join(shown)[:2000]}")
        if reply.error:
            raise AssertionError(f"cell raised {reply.error['ename']}: {reply.error['evalue']}\n"
                                 + "\n".join(reply.error["traceback"]) + "\n" + reply.text)
        return reply

    def settle(self) -> None:
        """Wait until nbddp has finished forking spare processes for the next cell (between cells).
        On a loaded machine a refill (the notebook's modules offered, then the forks, each spare's
        "ready") can take longer than spares.settle()'s default 10 s, after which a test saw only
        the spares made so far (1 of 3): up to 120 s here, and a refill still going then fails."""
        self.ok("import nbddp.forkserver.spares as _spares\n_spares.settle(120)\n"
                "assert _spares._worker is None or not _spares._worker.is_alive(), 'spares still forking after 120 s'",
                timeout=180)

    def descendants(self) -> list[psutil.Process]:
        """Processes under the kernel, without nbddp's idle spares (they have run nothing) and
        its store host (it lives as long as the kernel, like the forkserver: ``store_host``)."""
        try:
            procs = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [p for p in procs if not _is_spare(p) and not _is_store_host(p)]

    def store_host(self) -> psutil.Process | None:
        """The forkserver's process that hosts this kernel's rendezvous stores, if it runs."""
        try:
            procs = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        return next((p for p in procs if _is_store_host(p)), None)

    def forkserver(self) -> psutil.Process | None:
        """The kernel's forkserver (its child that runs multiprocess's forkserver), if it runs."""
        for proc in psutil.Process(self.pid).children():
            try:
                if "forkserver" in " ".join(proc.cmdline()):
                    return proc
            except psutil.Error:
                pass
        return None

    def load_nbddp(self) -> Kernel:
        """nbddp loaded, and its forkserver up: the first cell of a kernel waits for the
        forkserver to import torch and nbddp/forkserver/preload.py's list (seconds), which is
        no test's subject, so tests that bound a cell's time start after it."""
        self.ok("%load_ext nbddp")
        self.ok("%%ddp -n 1\npass", timeout=300)
        return self

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)
            self._sockets.close()


def _is_spare(proc) -> bool:
    try:
        return proc.name() == "nbddp-spare"
    except psutil.Error:
        return False


def _is_store_host(proc) -> bool:
    try:
        return proc.name() == "nbddp-stores"
    except psutil.Error:
        return False


def worker_pids(kernel: Kernel) -> list[int]:
    """Processes under the kernel that are ranks (not the forkserver, its store host or the
    resource tracker)."""
    kernel.settle()
    result = []
    for proc in kernel.descendants():
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "forkserver" in cmd and proc.ppid() == kernel.pid:
            continue
        if "resource_tracker" in cmd:
            continue
        result.append(proc.pid)
    return result
