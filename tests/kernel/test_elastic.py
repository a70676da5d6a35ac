"""%%ddp --launcher torchrun: the cell runs under torch's own elastic launcher, for real —
one node, and two nodes on 127.0.0.1 (two kernels, or a kernel and a plain torchrun)."""
import json
import os
import subprocess
import sys
import time

from support.helpers import alive, free_port, wait_gone, wait_until
from support.kernel import Kernel, plain

ALL_REDUCE = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * dist.get_rank(); dist.all_reduce(t)
print("sum", os.environ["RANK"], os.environ["WORLD_SIZE"], t.item())
dist.destroy_process_group()  # without it gloo may abort at exit, and torchrun then fails the node
"""


def torchruns(kernel):
    """torch.distributed.run processes (and the ranks they started) still under the kernel."""
    found = []
    for proc in kernel.descendants():
        try:
            cmd = " ".join(proc.cmdline())
        except Exception:
            continue
        if "torch.distributed.run" in cmd or "nbddp.rank.torchrun_rank" in cmd:
            found.append(proc.pid)
    return found


def rank_pids(kernel):
    out = kernel.ok("print(__import__('json').dumps([r.pid for r in _ddp.ranks if r.pid]))").stdout
    return json.loads(out)


def assert_nothing_left(kernel):
    pids = rank_pids(kernel)
    assert not wait_gone(pids, 5), "a rank outlived its cell"
    assert wait_until(lambda: not torchruns(kernel), 5), "torchrun or a rank outlived its cell"


def test_one_node_through_torchrun(kernel):
    reply = kernel.ok("%%ddp --launcher torchrun -n 2\n" + ALL_REDUCE, timeout=180)
    for r in range(2):
        assert f"[rank{r}]:sum {r} 2 1.0\n" in reply.stdout, reply.text
    kernel.ok("assert _ddp.ok and [r.state for r in _ddp.ranks] == ['ok'] * 2, _ddp.summary()")
    assert_nothing_left(kernel)


def test_failure_names_the_rank_and_its_line(kernel):
    reply = kernel.execute("""%%ddp --launcher torchrun -n 2
import os, time
if os.environ["RANK"] == "1":
    raise ValueError("bad shard")
time.sleep(30)
""", timeout=180)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    assert "[rank1]:ValueError: bad shard" in plain(reply.stderr)
    shown = "\n".join(reply.error["traceback"])
    assert "rank 1: failed (ValueError: bad shard at cell line 4)" in shown, shown
    assert "rank 0: terminated" in shown, shown
    assert reply.elapsed < 25  # torchrun stopped rank 0 instead of waiting out its sleep
    assert_nothing_left(kernel)


def test_timeout_stops_torchrun_and_shows_where(kernel):
    reply = kernel.execute("%%ddp --launcher torchrun -n 2 --timeout 15\nimport time\nprint('in')\ntime.sleep(300)\n",
                           timeout=180)
    assert reply.error and reply.error["ename"] == "DDPTimeout", reply.text
    assert "blocked at cell line 4: time.sleep(300)" in reply.stderr, reply.text
    assert_nothing_left(kernel)


def test_usage_errors_before_anything_starts(kernel):
    for line, words in [("--launcher torchrun --nnodes 2", "needs a meeting point"),
                        ("--nnodes 2 --rdzv-endpoint 127.0.0.1:1234", "use it with --launcher torchrun"),
                        ("--launcher torchrun --nnodes 2 --master-port 2345", "needs its --node-rank")]:
        reply = kernel.execute(f"%%ddp {line}\nprint(1)")
        # IPython shows a UsageError as one line on stderr (no traceback)
        assert reply.status == "error" and "UsageError: %%ddp:" in reply.stderr, (line, reply.text)
        assert words in reply.stderr and reply.stderr.count("\n") == 1, reply.stderr
    assert not torchruns(kernel)


def test_python_api_run_with_launcher_torchrun_runs_under_torchrun(kernel):
    cell = ALL_REDUCE + ("print('parent', open(f'/proc/{os.getppid()}/cmdline').read().split(chr(0))[:3])\n")
    reply = kernel.ok(f"import nbddp\nr = nbddp.run({cell!r}, n=2, launcher='torchrun', timeout=120)", timeout=180)
    for r in range(2):
        assert f"[rank{r}]:sum {r} 2 1.0\n" in reply.stdout, reply.text
        assert f"[rank{r}]:parent ['{sys.executable}', '-m', 'torch.distributed.run']" in reply.stdout, reply.text
    kernel.ok("import os; assert os.path.isdir(os.path.join(r.log_dir, 'torchrun')), r.log_dir")
    reply = kernel.execute("nbddp.run(lambda: 1, n=2, launcher='torchrun')")
    assert reply.error and reply.error["ename"] == "DDPUsageError", reply.text
    assert "--launcher torchrun runs the cell as a script" in reply.error["evalue"]
    assert not torchruns(kernel)


def test_two_kernels_form_one_two_node_job(kernel, tmp_path):
    port = free_port()
    line = (f"%%ddp --launcher torchrun --nnodes 2 --nproc-per-node 1 --rdzv-endpoint 127.0.0.1:{port} "
            f"--rdzv-id two-kernels --rdzv-timeout 90\n")
    other = Kernel(cwd=str(tmp_path))
    try:
        other.ok("%load_ext nbddp")
        first = kernel.kc.execute(line + ALL_REDUCE)
        second = other.kc.execute(line + ALL_REDUCE)
        replies = [kernel.collect(first, 240), other.collect(second, 240)]
        for reply in replies:
            assert not reply.error, reply.text
        text = replies[0].stdout + replies[1].stdout
        for r in range(2):  # every rank of the world: right sum, right world size
            assert f"[rank{r}]:sum {r} 2 1.0\n" in text, text
        assert replies[0].stdout.count(":sum ") == replies[1].stdout.count(":sum ") == 1
        assert_nothing_left(kernel)
        assert_nothing_left(other)
    finally:
        other.shutdown()


def test_kernel_and_plain_torchrun_form_one_job(kernel, tmp_path):
    port = free_port()
    script = tmp_path / "node.py"
    script.write_text(ALL_REDUCE)
    opts = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=mixed", "--rdzv-conf=join_timeout=90"]
    env = dict(os.environ, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]:")
    plain = subprocess.Popen([sys.executable, "-m", "torch.distributed.run"] + opts + ["--tee=3", str(script)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        reply = kernel.ok(f"%%ddp --launcher torchrun --nnodes 2 --nproc-per-node 2 --rdzv-endpoint 127.0.0.1:{port} "
                          f"--rdzv-id mixed --rdzv-timeout 90\n" + ALL_REDUCE, timeout=240)
        plain_out = plain.communicate(timeout=120)[0].decode()
        assert plain.returncode == 0, plain_out
        text = reply.stdout + plain_out
        for r in range(4):
            assert f"[rank{r}]:sum {r} 4 6.0" in text, text
        assert reply.stdout.count(":sum ") == 2
        kernel.ok("assert _ddp.ok and len(_ddp.ranks) == 2, _ddp.summary()")
        assert_nothing_left(kernel)
    finally:
        if plain.poll() is None:
            os.killpg(plain.pid, 9)
            plain.wait()


def test_node_that_never_joins_is_a_clear_rendezvous_timeout(kernel):
    port = free_port()
    start = time.monotonic()
    reply = kernel.execute(f"%%ddp --launcher torchrun --nnodes 2 --rdzv-endpoint 127.0.0.1:{port} "
                           f"--rdzv-timeout 5\n" + ALL_REDUCE, timeout=180)
    assert time.monotonic() - start < 90
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    shown = "\n".join(reply.error["traceback"]) + reply.stderr
    assert "rendezvous timed out: not all 2 nodes joined at 127.0.0.1:" in shown, shown
    assert "within 5 s" in shown
    assert_nothing_left(kernel)


def test_max_restarts_lets_torchrun_restart_a_failed_attempt(kernel):
    reply = kernel.execute("""%%ddp --launcher torchrun -n 2 --max-restarts 1
import os
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("attempt", attempt)
if attempt == 0 and os.environ["RANK"] == "1":
    raise RuntimeError("flaky first attempt")
""", timeout=180)
    assert reply.status == "ok", reply.text
    assert "[rank1]:RuntimeError: flaky first attempt" in plain(reply.stderr), reply.text
    for r in (0, 1):
        assert f"[rank{r}]:attempt 1" in reply.stdout, reply.text
    assert "rank 1 restarted by torchrun (restart 1)" in reply.text, reply.text
    states = kernel.ok("print([(r.rank, r.state) for r in _ddp.ranks])").stdout
    assert states.strip() == "[(0, 'ok'), (1, 'ok')]", states
    assert_nothing_left(kernel)


def test_interrupt_stops_torchrun_and_its_ranks(fresh_kernel):
    k = fresh_kernel
    reply, pressed = k.interrupted_when("%%ddp --launcher torchrun -n 2\nimport os, time\n"
                                        "print('PID', os.getpid(), flush=True)\ntime.sleep(120)\n",
                                        lambda r: r.stdout.count("PID ") == 2, timeout=120)
    took = time.monotonic() - pressed
    pids = [int(line.split()[-1]) for line in reply.stdout.splitlines() if "PID " in line]
    assert reply.error and reply.error["ename"] == "KeyboardInterrupt", reply.text
    assert not alive(pids), "a rank outlived the interrupt"
    assert not torchruns(k), "torchrun outlived the interrupt"
    assert took < 5, f"interrupt took {took:.1f} s"
    assert "interrupted: torchrun and all its ranks were stopped" in reply.text
    assert k.ok("%%ddp -n 2\nprint('next')").stdout.count("next") == 2  # the kernel goes on
