"""The %%ddp engine in a real kernel: real worker processes, real gloo collectives."""
import json
import re

import pytest

from support.helpers import wait_gone
from support.kernel import plain

MAIN_CELL = """%%ddp -n 4
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * dist.get_rank(); dist.all_reduce(t)
print(os.environ["RANK"], os.environ["LOCAL_RANK"], t.item())
"""


def test_main_cell_every_rank_prints_rank_local_rank_and_sum(kernel):
    reply = kernel.ok(MAIN_CELL)
    for r in range(4):
        assert f"[rank{r}]:{r} {r} 6.0\n" in reply.stdout, reply.text
    kernel.ok("assert _ddp.ok and [r.state for r in _ddp.ranks] == ['ok'] * 4")
    pids = json.loads(kernel.ok("print(__import__('json').dumps([r.pid for r in _ddp.ranks]))").stdout)
    assert len(set(pids)) == 4
    assert not wait_gone(pids, 2), "a rank outlived its cell"


def test_script_conventions_argv_name_cwd_file(kernel):
    reply = kernel.ok("""%%ddp -n 2 -- --lr 0.5 data.txt
import argparse, os, sys
p = argparse.ArgumentParser(); p.add_argument("--lr", type=float); p.add_argument("path")
a = p.parse_args()
print(__name__, a.lr, a.path, os.path.basename(sys.argv[0]),
      os.getcwd() == os.environ["PWD_SEEN"] if "PWD_SEEN" in os.environ else os.getcwd())
print("file", __file__ == sys.argv[0])
""")
    kernel_cwd = kernel.ok("import os; print(os.getcwd())").stdout.strip()
    kernel_pid = kernel.ok("import os; print(os.getpid())").stdout.strip()
    for r in range(2):  # the script is a hidden file beside the notebook (nbddp/kernel/cellscript.py)
        assert f"[rank{r}]:__main__ 0.5 data.txt .nbddp-{kernel_pid}.py {kernel_cwd}\n" in reply.stdout, reply.text
        assert f"[rank{r}]:file True\n" in reply.stdout


def test_legacy_launch_passes_local_rank_argument(kernel):
    reply = kernel.ok("""%%ddp -n 2 --nnodes 2 --legacy-launch
import argparse
p = argparse.ArgumentParser(); p.add_argument("--local-rank", "--local_rank", type=int)
print("local", p.parse_args().local_rank)
""")
    assert "[rank0]:local 0\n" in reply.stdout and "[rank1]:local 0\n" in reply.stdout
    reply = kernel.ok("""%%ddp -n 2 --legacy-launch underscore
import sys; print(sys.argv[1:])
""")
    assert "[rank1]:['--local_rank=1']" in reply.stdout, reply.text


def test_simulated_nodes_arithmetic(kernel):
    reply = kernel.ok("""%%ddp -n 4 --nnodes 2
import os
e = os.environ
print(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"])
""")
    for rank in range(4):
        assert f"[rank{rank}]:{rank} {rank % 2} {rank // 2} 4 2 2\n" in reply.stdout, reply.text
    reply = kernel.ok("%%ddp --nproc-per-node 2 --nnodes 2\nimport os; print(os.environ['WORLD_SIZE'])")
    assert reply.stdout.count(":4\n") == 4


def test_env_option_and_user_env_inherited(kernel):
    kernel.ok("import os; os.environ['FROM_KERNEL'] = 'yes'")
    reply = kernel.ok("%%ddp -n 2 --env A=1 --env B=x=y\n"
                      "import os; print(os.environ['A'], os.environ['B'], os.environ['FROM_KERNEL'])")
    assert reply.stdout.count("1 x=y yes\n") == 2


def test_traceback_shows_the_cell_line_and_cell_raises(kernel):
    reply = kernel.execute("""%%ddp -n 3
import os
rank = int(os.environ["RANK"])
if rank == 1:
    raise ValueError("bad batch on rank one")
import time; time.sleep(30)
""", timeout=60)
    assert reply.error and reply.error["ename"] == "DDPError"
    assert reply.elapsed < 15
    text = "\n".join(reply.error["traceback"])
    assert "rank 1: failed (ValueError: bad batch on rank one at cell line 5)" in text
    # the traceback, with the cell's own source line, once: in rank 1's output, which the error points at
    assert '[rank1]:----> 5     raise ValueError("bad batch on rank one")' in plain(reply.stderr), reply.stderr
    assert "Traceback" not in text and "rank 1's traceback is in its output above" in text
    assert "ranks 0,2: terminated (stopped by nbddp after rank 1 failed)" in text   # said once for both
    assert "[rank1]:ValueError: bad batch on rank one" in plain(reply.stderr)
    assert "nbddp/sources/local.py" not in text and "magic.py" not in text  # no traceback from inside


@pytest.mark.parametrize("body, cause", [
    ("import sys, os\nif os.environ['RANK'] == '1': sys.exit(3)\nimport time; time.sleep(30)",
     "rank 1: failed (exited with code 3)"),
    ("import os\nif os.environ['RANK'] == '0': os._exit(1)\nimport time; time.sleep(30)",
     "rank 0: failed (exited with code 1)"),
    ("import os, signal\nif os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
     "import time; time.sleep(30)",
     "rank 1: killed (killed by SIGKILL"),
])
def test_exit_codes_and_signals_fail_the_cell(kernel, body, cause):
    reply = kernel.execute("%%ddp -n 2\n" + body, timeout=60)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    assert cause in "\n".join(reply.error["traceback"])


def test_sys_exit_zero_is_success(kernel):
    reply = kernel.ok("%%ddp -n 2\nimport sys\nprint('leaving'); sys.exit(0)")
    assert reply.stdout.count("leaving") == 2


def test_syntax_error_reported_once_before_spawning(kernel):
    reply = kernel.execute("%%ddp -n 4\nx = 1\ny = (1,\nprint('never')")
    assert reply.status == "error"
    assert reply.stderr.startswith("UsageError: %%ddp: cell line 3 has a syntax error, so no rank was started:")
    assert "    y = (1,\n        ^\nSyntaxError: '(' was never closed" in reply.stderr
    assert "[rank" not in reply.text and "magic.py" not in reply.text and "nbddp: " not in reply.stdout


@pytest.mark.parametrize("line, reason", [
    ("-n 0", "-n must be at least 1"),
    ("-n x", "-n must be a whole number"),
    ("-n 2 --bogus", "unrecognized arguments: --bogus"),
    ("-n 4 --nnodes 3", "cannot be split evenly"),
    ("-n 2 --master-port 70000", "port must be between 1 and 65535"),
    ("-n 2 --env NOEQUALS", "--env takes KEY=VALUE"),
    ("-n 2 --timeout -1", "--timeout must be more than 0"),
    # ranks would wait for a store on 29999 that nobody hosts
    ("-n 2 --env MASTER_PORT=29999",
     "the launcher sets MASTER_PORT for each rank, as torchrun does; use --master-port PORT"),
    ("-n 2 --env RANK=0", "choose the topology with -n"),
])
def test_bad_arguments_raise_usage_error_before_any_process(kernel, line, reason):
    kernel.settle()
    before = set(p.pid for p in kernel.descendants())
    reply = kernel.execute(f"%%ddp {line}\nprint('the-cell-body-ran')")
    # IPython shows a UsageError as one line on stderr, and the cell's status is "error"
    assert reply.status == "error" and reply.stderr.startswith("UsageError: %%ddp: "), reply
    assert reason in reply.stderr
    assert reply.stderr.strip().count("\n") == 0
    assert "the-cell-body-ran" not in reply.stdout
    assert set(p.pid for p in kernel.descendants()) <= before


def test_port_in_use_is_a_clear_error(kernel):
    import socket
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        reply = kernel.execute(f"%%ddp -n 2 --master-port {port}\nprint('the-cell-body-ran')")
    finally:
        s.close()
    assert reply.status == "error" and f"MASTER_PORT {port} is already in use" in reply.stderr, reply
    assert "the-cell-body-ran" not in reply.stdout


def test_output_fd_level_c_level_and_child_processes(kernel):
    reply = kernel.ok("""%%ddp -n 2
import os, subprocess, sys, ctypes
os.write(1, b"raw fd write\\n")
ctypes.CDLL(None).printf(b"from C printf\\n"); ctypes.CDLL(None).fflush(None)
subprocess.run(["sh", "-c", "echo child out; echo child err >&2"])
print("to stderr", file=sys.stderr)
""")
    for r in range(2):
        for line in ("raw fd write", "from C printf", "child out"):
            assert f"[rank{r}]:{line}\n" in reply.stdout, reply.text
        for line in ("child err", "to stderr"):
            assert f"[rank{r}]:{line}\n" in reply.stderr, reply.text


def test_no_line_lost_4_ranks_20000_lines_in_order(kernel):
    reply = kernel.ok("""%%ddp -n 4 --idle-warning 600
import os
r = os.environ["RANK"]
for i in range(20000):
    print(f"{r}:{i}")
""", timeout=240)
    for r in range(4):
        got = [int(m) for m in re.findall(rf"^\[rank{r}\]:{r}:(\d+)$", reply.stdout, re.M)]
        gap = next((i for i, v in enumerate(got) if v != i), None)
        assert got == list(range(20000)), f"rank {r}: {len(got)} lines, first gap at {gap}"
    kernel.ok("assert all(r.stdout.count('\\n') == 20000 for r in _ddp.ranks)")


def test_callable_from_the_notebook_runs_and_returns(kernel):
    kernel.ok("""
import nbddp
SCALE = 10
def work(offset):
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(os.environ["RANK"])]); dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item() * SCALE + offset
res = nbddp.run(work, n=3, args=(1,))
assert res.values == [31.0, 31.0, 31.0], res.values
""")


def test_next_cell_works_after_a_failure(kernel):
    kernel.execute("%%ddp -n 2\nraise SystemExit(5)")
    reply = kernel.ok("%%ddp -n 2\nprint('again')")
    assert reply.stdout.count("again") == 2


def test_omp_threads_is_one_like_torchrun(kernel):
    reply = kernel.ok("%%ddp -n 2\nimport torch, os; print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads())")
    assert reply.stdout.count("1 1\n") == 2


def test_spawn_start_method(kernel):
    reply = kernel.ok(MAIN_CELL.replace("-n 4", "-n 2 --start-method spawn"), timeout=180)
    assert "[rank1]:1 1 1.0\n" in reply.stdout, reply.text


def test_the_cell_after_load_ext_races_no_background_torch_import(tmp_path):
    """%load_ext returns at once and starts the forkserver, which imports torch; the kernel
    imports none (tests/kernel/test_light_kernel.py), so a cell that imports torch itself cannot meet a
    second import of it in another thread (two threads in torch's nested imports can abort the
    kernel) and works at once."""
    from support.kernel import Kernel

    k = Kernel(cwd=str(tmp_path))
    try:
        k.ok("%load_ext nbddp")
        reply = k.ok("import sys\nprint('torch' in sys.modules)")
        assert reply.stdout.strip() == "False", reply.text
        k.ok("import torch, torch.distributed as dist\nprint(torch.ones(2).sum().item())")
    finally:
        k.shutdown()
