"""Nothing of a kernel outlives it, however it dies: SIGKILL of the kernel alone (a crash, the
OOM killer) or of its whole process group (Jupyter's restart of a kernel that does not answer);
idle, mid-cell, right after a cell (spares being forked); with the forkserver stuck, or a rank
stuck in C code holding the GIL (its lifeline thread cannot run, as in torch's gloo teardown
deadlock). Within 5 s no process of it is left (by pid: the forkserver, the resource tracker,
spares, ranks, nbddp's watcher) and its temporary folder is empty: no ``pymp-*`` (multiprocess),
no ``nbddp-*`` (logs, the ranks' private torch compile cache ``nbddp-inductor-*``). A child the
kernel forked (``os.fork()``, a multiprocessing fork worker) and that outlives it changes none
of that (nbddp/kernel/forkguard.py)."""
import glob
import os
import secrets
import signal
import subprocess
import sys
import time

import psutil
import pytest

from support.helpers import alive, wait_gone, wait_until
from support.kernel import Kernel

SLEEPING = "%%ddp -n 2\nimport time\nprint('running', flush=True)\ntime.sleep(120)"
HOLDING_THE_GIL = "%%ddp -n 2\nimport re\nprint('running', flush=True)\nre.match(r'(a+)+$', 'a' * 60 + 'b')"


def as_in_jupyter() -> dict:
    """The environment without pytest's mark, so ipykernel captures fds 1 and 2 (into pipes of
    its own, keeping a copy of the originals) as under Jupyter."""
    return {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}


def _processes_of(k: Kernel, tmp: str) -> list[int]:
    """Every process the kernel made: its descendants, and those that left its tree but carry
    its environment (the watcher, processes whose parent died)."""
    pids = {p.pid for p in psutil.Process(k.pid).children(recursive=True)}
    for proc in psutil.process_iter():
        try:
            if proc.pid != k.pid and proc.environ().get("TMPDIR") == tmp:
                pids.add(proc.pid)
        except psutil.Error:
            pass
    return sorted(pids)


# The stuck helpers are in sessions of their own, out of the kernel's group's reach: killing
# the kernel alone or its group is the same case for them.
CASES = [(target, moment) for target in ("kernel", "group") for moment in ("idle", "mid-cell", "after-a-cell")]
CASES += [("kernel", "forkserver-stuck"), ("kernel", "rank-holding-the-gil")]
# the kernel forked a child (os.fork(), a multiprocessing fork worker) that outlives it: it held
# the watcher's, the forkserver's and the resource tracker's pipes, so nothing was cleaned up
CASES += [("kernel", "forked-child")]

FORK = "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(300)\n    os._exit(0)\nprint('CHILD', pid)"
PUSHING = "%%ddp -n 2 --push x\nimport time\nprint('running', flush=True)\ntime.sleep(120)"


@pytest.mark.parametrize("target,moment", CASES)
def test_nothing_of_a_killed_kernel_outlives_it(tmp_path, target, moment):
    tmp = str(tmp_path / "tmp")
    os.mkdir(tmp)
    k = Kernel(cwd=str(tmp_path), env=dict(as_in_jupyter(), TMPDIR=tmp))
    pids, child = [], None
    try:
        k.ok("%load_ext nbddp")
        k.ok("%%ddp -n 2\nimport torch\nprint(torch.ones(2).sum())", timeout=300)
        if moment == "after-a-cell":
            k.ok("%%ddp -n 2\nprint('done')")
        else:
            k.settle()
        if moment == "mid-cell":
            k.start_until(SLEEPING, lambda text: text.count("running") == 2)
        elif moment == "rank-holding-the-gil":
            k.start_until(HOLDING_THE_GIL, lambda text: text.count("running") == 2)
        elif moment == "forkserver-stuck":
            os.kill(k.forkserver().pid, signal.SIGSTOP)
        elif moment == "forked-child":
            child = int(k.ok(FORK).stdout.split("CHILD")[1])
            k.ok("x = 42")
            k.start_until(PUSHING, lambda text: text.count("running") == 2)
            assert glob.glob(f"/dev/shm/nbddp-push-{k.pid}-*")
        pids = [pid for pid in _processes_of(k, tmp) if pid != child]
        assert len(pids) >= 3, pids  # at least the forkserver, the resource tracker and the watcher
        kernel, killed = k.pid, time.monotonic()
        os.kill(kernel, signal.SIGKILL) if target == "kernel" else os.killpg(os.getpgid(kernel), signal.SIGKILL)
        survivors = wait_gone(pids, 5)
        while os.listdir(tmp) and time.monotonic() < killed + 5:  # the watcher removes them last
            time.sleep(0.05)
        assert not survivors, f"outlived the kernel: {[(p, psutil.Process(p).cmdline()[:3]) for p in survivors]}"
        assert os.listdir(tmp) == [], "left behind in the temporary folder"
        assert not glob.glob(f"/dev/shm/nbddp-push-{kernel}-*"), "pushed values left behind"
        assert not glob.glob(str(tmp_path / ".nbddp-*")), "the cell's script left beside the notebook"
    finally:
        if child is not None:
            pids.append(child)
        k.kc.stop_channels()
        for pid in alive(pids):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        if k.km.is_alive():
            k.km.shutdown_kernel(now=True)


def test_the_process_reading_the_kernels_stderr_is_not_the_kernels_to_end(tmp_path):
    """Jupyter's server reads a kernel's stdout/stderr through pipes, and multiprocess passes
    stderr to the resource tracker: that pipe is not one of the kernel's own."""
    r, w = os.pipe()
    server = subprocess.Popen(["sleep", "300"], stdin=r)  # holds the read end, as the server does
    os.close(r)
    k = Kernel(cwd=str(tmp_path), env=as_in_jupyter(), stdout=w, stderr=w)
    os.close(w)
    try:
        k.ok("%load_ext nbddp")
        k.ok("%%ddp -n 2\npass", timeout=300)
        os.kill(k.pid, signal.SIGKILL)
        time.sleep(5)
        assert server.poll() is None, "nbddp's watcher ended the process reading the kernel's stderr"
    finally:
        k.kc.stop_channels()
        server.kill()
        server.wait()
        if k.km.is_alive():
            k.km.shutdown_kernel(now=True)


def test_the_watcher_ends_writers_first_and_reads_its_orders():
    """Pure parts of nbddp/kernel/janitor.py: a process holding a write end of a kernel's pipe is a
    writer (ended at once) even if it also holds a read end; others' pipes are not looked at."""
    from nbddp.kernel.janitor import holders, parse

    ends = [(10, 7, False), (11, 7, True), (12, 8, True), (12, 7, False), (13, 9, True), (14, 8, False)]
    assert holders(ends, {7, 8}) == ({11, 12}, {10, 14})
    assert parse([b"rm /tmp/a b\n", b"rmdir /tmp/c\n", b"pipe 42\n", b"pipe x\n"]) == (["/tmp/a b"], ["/tmp/c"], {42})


def test_the_watcher_ignores_sigterm_and_sighup_and_still_cleans_up(tmp_path):
    """systemd and TLJH stop a kernel's processes with SIGTERM (a closed terminal sends SIGHUP):
    nbddp's watcher stays, and removes the kernel's folder when the kernel ends."""
    folder, token = tmp_path / "nbddp-logs", secrets.token_hex(8)
    folder.mkdir()
    code = ("import sys, time\nfrom nbddp.kernel import janitor\n"
            f"janitor.remove_at_exit({str(folder)!r})\nprint('ready', flush=True)\ntime.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                             env=dict(os.environ, NBDDP_TEST_TOKEN=token))
    try:
        assert owner.stdout.readline().strip() == "ready"

        def watchers():
            found = []
            for proc in psutil.process_iter():
                try:
                    if proc.environ().get("NBDDP_TEST_TOKEN") == token and proc.pid != owner.pid:
                        found.append(proc)
                except psutil.Error:
                    pass
            return found

        watcher = wait_until(watchers, 5)
        assert watcher and "janitor.py" in " ".join(watcher[0].cmdline()), watcher
        watcher = watcher[0]
        assert wait_until(lambda: watcher.cwd() == "/", 5)  # its main() runs: the first thing it does
        time.sleep(0.2)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            watcher.send_signal(sig)
        time.sleep(0.5)
        assert watcher.is_running() and watcher.status() != psutil.STATUS_ZOMBIE, "the watcher died of SIGTERM/SIGHUP"
        assert folder.exists()
        owner.kill()
        owner.wait()
        assert wait_until(lambda: not folder.exists(), 5), "the watcher did not remove the folder"
        assert not wait_gone([watcher.pid], 5)
    finally:
        owner.kill()
        owner.wait()


def test_a_forked_child_closes_what_the_kernel_holds_but_not_a_reused_number():
    """nbddp/kernel/forkguard.py: a held descriptor is closed in a forked child; one closed since
    and whose number now names another file is left open."""
    code = ("import os\nfrom nbddp.kernel import forkguard\n"
            "r, w = os.pipe(); forkguard.hold(w)\n"
            "r2, w2 = os.pipe(); forkguard.hold(w2); os.close(w2); w3 = os.dup(r)\n"
            "assert w3 == w2\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    def is_open(fd):\n"
            "        try:\n"
            "            os.fstat(fd)\n"
            "            return True\n"
            "        except OSError:\n"
            "            return False\n"
            "    os._exit(0 if not is_open(w) and is_open(w3) else 1)\n"
            "print('child', os.waitpid(pid, 0)[1], 'parent', os.fstat(w) is not None)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "child 0 parent True", done.stdout + done.stderr
