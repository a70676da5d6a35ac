"""The notebook kernel never imports torch (#38, "A light kernel"): the rendezvous stores and the
CUDA device count are answered by the forkserver's store host (nbddp/forkserver/storehost.py),
so a kernel after a launch stays ~60 MB instead of ~250 (benchmarks/kernel_memory.py)."""
from __future__ import annotations

TORCH = "import sys\nprint(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])"
DEVICES = "from nbddp.forkserver import storehost\nprint(storehost.device_count())"


def test_a_kernel_after_a_launch_has_not_imported_torch(fresh_kernel):
    k = fresh_kernel
    assert "rank 1 here" in k.ok("%%ddp -n 2\nimport os\nprint('rank', os.environ['RANK'], 'here')").text
    assert k.ok(TORCH).text.strip().splitlines()[-1] == "[]"
    assert k.store_host() is not None, "no store host runs"
    import torch  # here, in the test's process: the count the kernel's ranks are planned with

    counted = int(k.ok(DEVICES).text.strip().splitlines()[-1])
    assert counted == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_a_held_master_port_is_one_line_from_the_store_host(fresh_kernel):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        reply = fresh_kernel.execute(f"%%ddp -n 2 --master-port {port}\nprint('ran')")
    assert f"MASTER_PORT {port} is already in use" in reply.text, reply.text
    assert "ran" not in reply.text.replace("already", "")
    assert "Traceback" not in reply.text


PLAIN = """import nbddp
result = nbddp.run("import os; print('rank', os.environ['RANK'])", n=2)
print('ranks', [r.state for r in result.ranks], flush=True)
from nbddp.forkserver import storehost
print('host', storehost._host["process"].pid, flush=True)
"""


def test_a_plain_script_using_nbddp_run_ends_with_its_last_line(tmp_path):
    """The store host is the script's too: at the interpreter's exit it must end, not be waited
    for (a script once hung there until killed)."""
    import subprocess
    import sys
    import time

    import psutil

    script = tmp_path / "job.py"
    script.write_text(PLAIN)
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ranks ['ok', 'ok']" in done.stdout, done.stdout
    assert time.monotonic() - began < 80
    host = int(done.stdout.split("host ", 1)[1].split()[0])

    def alive() -> bool:
        try:
            return psutil.Process(host).name() == "nbddp-stores"
        except psutil.Error:
            return False

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive():
        time.sleep(0.2)
    assert not alive(), f"the store host (pid {host}) outlived its script"


def test_a_child_the_kernel_forks_says_nothing_of_the_store_hosts_pipe(fresh_kernel):
    """torchrun's agent is started with a pre-exec function, so the kernel's at-fork hooks run in
    it: the store host's pipe is closed there through its Connection, and nothing is printed into
    the cell's output (it said "Exception ignored … Bad file descriptor" under the light kernel)."""
    k = fresh_kernel
    k.ok("%%ddp -n 1 --timeout 60\npass")  # the store host is running
    reply = k.ok("%%ddp --launcher torchrun -n 2 --timeout 120\nimport os\nprint('rank', os.environ['RANK'])")
    assert "rank 1" in reply.stdout, reply.text
    assert "Exception ignored" not in reply.text and "Bad file descriptor" not in reply.text, reply.text
