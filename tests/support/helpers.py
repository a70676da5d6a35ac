"""Helpers the test files share: a free port, waiting with a deadline, and whether processes
still run. (The kernel driver is tests/support/kernel.py.)"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

import psutil


def run_with_papermill(cells: list[str], folder) -> tuple:
    """A notebook of ``cells`` run by papermill in ``folder``, as CI runs the lessons: (the
    executed notebook, the path of its saved copy)."""
    import nbformat
    import papermill

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src, dst = os.path.join(folder, "in.ipynb"), os.path.join(folder, "out.ipynb")
    nbformat.write(nb, src)
    from support.lessons import executed
    with executed.ipc_kernel() as config:
        papermill.execute_notebook(src, dst, kernel_name="python3", cwd=str(folder), config=config,
                                   progress_bar=False, request_save_on_cell_execute=False)
    return nbformat.read(dst, as_version=4), dst


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
                    raise RuntimeError(f"{module} did not start:\n" + open(log_path).read()[-3000:]) from None
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


@contextlib.contextmanager
def jupyterlab(tmp_path, cells, disabled_extensions=(), theme=None):
    """JupyterLab (``jupyter_server``; Notebook 7 too, the same server, where installed) with a
    temporary root holding ``ddp.ipynb`` (``cells``, each a code cell's source) and its own config,
    settings and runtime folders; ``disabled_extensions`` are turned off as a server without them
    would be (page_config.json); ``theme`` (e.g. "JupyterLab Dark") is the user's theme setting.
    Yields (base URL, token, tmp_path)."""
    root = tmp_path / "root"
    root.mkdir()
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                     "outputs": [], "source": src} for i, src in enumerate(cells)],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / "ddp.ipynb").write_text(json.dumps(nb))
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    if theme:
        (settings / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))
    if disabled_extensions:
        labconfig = tmp_path / "config" / "labconfig"
        labconfig.mkdir(parents=True)
        (labconfig / "page_config.json").write_text(
            json.dumps({"disabledExtensions": {name: True for name in disabled_extensions}}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"))
    env.pop("NBDDP_OUTPUT", None)
    with jupyter_server("jupyterlab", root, env, tmp_path / "lab.log", "--LabApp.news_url=") as (base, token):
        yield base, token, tmp_path
