"""Helpers the test files share: a free port, waiting with a deadline, and whether processes
still run. (The kernel driver is tests/kernel.py.)"""
from __future__ import annotations

import contextlib
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

import psutil


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float, every: float = 0.05):
    """Call ``condition()`` until it returns something true or ``timeout`` s have passed;
    return its last value (false when time ran out), so the caller's assert shows it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)


def alive(pids) -> list[int]:
    """The pids among ``pids`` that still run (zombies count as gone)."""
    living = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """Wait (``timeout`` s at most) until none of ``pids`` runs; the ones still running."""
    wait_until(lambda: not alive(pids), timeout)
    return alive(pids)


@contextlib.contextmanager
def jupyter_server(module: str, root, env: dict, log_path, *args: str, timeout: float = 90):
    """A Jupyter server (``module``: "jupyterlab", "jupyter_server", …) on a free loopback port with
    a token, serving ``root``; yields (base URL, token) once it answers, ends it afterwards. Its
    iopub rate limits are left at their defaults."""
    port, token = free_port(), secrets.token_hex(16)
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--allow-root", *args], cwd=str(root), env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.close()
                    raise RuntimeError(f"{module} did not start:\n" + open(log_path).read()[-3000:])
                time.sleep(0.3)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
