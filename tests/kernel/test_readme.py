"""The README's shell commands, run as a new user would: every fenced ``bash`` block of README.md
is either run here, line by line in README order, on a copy of the checkout (so a fresh ``.venv``,
``dist/`` and kernelspec, none of the developer's), or named with the reason it cannot run on a
test machine (support/readme.py's table; tests/unit/test_readme_shape.py fails at once on a block
the README gains until it is given one or the other).

What the environment adds, and why (no command is changed, except ``--no-browser`` for the
server): ``PIP_CONSTRAINT`` pins torch to the build this suite runs on, so ``pip install torch``
can never fetch another (multi-GB) build; ``PIP_NO_COMPILE`` skips byte-compiling all of torch
(a minute on 2 cores; what an import touches is compiled as it is imported); the Jupyter runtime
folder is the test's own.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

import support
from support.readme import LINES, SERVER, command_and_comment, plan, readme_blocks

ROOT = str(support.ROOT)

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The tracked and untracked-but-not-ignored files of this checkout, as a fresh clone has them."""
    dest = tmp_path_factory.mktemp("clone") / "nbddp"
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(dest / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), dest / name)
    return dest


def user_env(clone, tmp_path) -> dict:
    """A user's shell with the clone's .venv activated (once demo.sh made it), nothing of ours."""
    import torch

    pins = tmp_path / "pins.txt"
    pins.write_text(f"torch=={torch.__version__}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHON")}
    env.update(PATH=f"{clone}/.venv/bin:{env['PATH']}", VIRTUAL_ENV=str(clone / ".venv"),
               PIP_CONSTRAINT=str(pins), PIP_NO_COMPILE="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"))
    return env


def run_line(command: str, clone, env) -> str:
    done = subprocess.run(["bash", "-c", f"set -euo pipefail; {command}"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"README command failed: {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def server_command(line: str) -> str:
    """The README's ``jupyter lab`` line, or as root what its comment says to run as root."""
    command, comment = command_and_comment(line)
    as_root = re.search(r"as root[^:]*:\s*(\S.*)$", comment)
    if os.geteuid() == 0:
        assert as_root, f"the README's `{command}` says nothing of root, where Jupyter refuses to start"
        command = as_root.group(1).strip()
    return command + " --no-browser"


def serve_and_ask(command: str, clone, env) -> dict:
    """Start the server as the line says, wait (90 s at most) for its URL, ask for its
    kernelspecs, stop it (and its process group) and return them."""
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=clone, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    lines: list[str] = []
    found = threading.Event()

    def read():
        for text in proc.stderr:
            lines.append(text)
            if re.search(r"http://(127\.0\.0\.1|localhost):\d+/lab\?token=\w+", text):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 90
        while not found.is_set() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert found.is_set(), f"`{command}` did not start:\n{''.join(lines)[-3000:]}"
        url = next(m.group(0) for m in map(re.compile(r"http://\S+/lab\?token=\w+").search, lines) if m)
        base, token = url.split("/lab?token=")
        # the URL is printed as the server starts listening: a refused first connection is retried
        for _ in range(60):
            try:
                with urllib.request.urlopen(f"{base}/api/kernelspecs?token={token}", timeout=30) as reply:
                    return json.load(reply)
            except urllib.error.URLError as exc:
                if not isinstance(exc.reason, ConnectionRefusedError) or proc.poll() is not None:
                    raise
                time.sleep(0.5)
        raise AssertionError(f"`{command}` refused connections for 30 s:\n{''.join(lines)[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def test_readme_commands_work_on_a_fresh_clone(clone, tmp_path):
    import torch

    env = user_env(clone, tmp_path)
    ran, skipped = [], []
    for block in readme_blocks():
        why = plan(block)
        if why:
            skipped.append((block[0], why))
            continue
        for line in block:
            command, _ = command_and_comment(line)
            if not command or command.startswith("#"):
                continue
            reason = next((why for start, why in LINES.items() if command.startswith(start)), None)
            if reason:
                skipped.append((command, reason))
            elif command.startswith(SERVER):
                started = time.monotonic()
                specs = serve_and_ask(server_command(line), clone, env)
                # the kernel demo.sh installed inside .venv is the one the lessons' hint names
                assert "nbddp-venv" in specs["kernelspecs"], specs
                ran.append(f"{command}  ({time.monotonic() - started:.0f} s)")
            else:
                started = time.monotonic()
                out = run_line(command, clone, env)
                ran.append(f"{command}  ({time.monotonic() - started:.0f} s)")
                if command == "bash scripts/demo.sh":
                    assert "[rank3]:RANK=3 LOCAL_RANK=3 WORLD_SIZE=4 sum=6.0" in out, out
                    # each rank's line once: streamed, and not again from the transcript
                    assert out.count("RANK=3 LOCAL_RANK=3") == 1, out
                    assert f"torch {torch.__version__} (" in out, out  # setup-venv.sh says which build
    assert any(c.startswith("python -m build") or "python -m build" in c for c in ran), ran
    assert (clone / "dist").is_dir() and list((clone / "dist").glob("nbddp-*.whl")), ran
    print("ran:", *ran, "not here:", *(f"{c}: {why}" for c, why in skipped), sep="\n  ")
