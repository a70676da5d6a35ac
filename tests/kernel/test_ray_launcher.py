"""%%ddp --launcher ray: the cell runs on a real two-node Ray cluster on this machine (Ray's own
multi-node test facility: a head and a second node, each a raylet of its own), one torchrun per
node; and on a local Ray the launch starts and stops. After each launch nothing is left: no
NodeAgent actor alive, no placement group, no torchrun or rank (by the launch's log folder in
their command lines), no Ray process the launch started."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import ray  # the test extra installs it (nbddp[ray])

from support.helpers import free_port, wait_until
from support.kernel import Kernel, plain

ALL_REDUCE = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1); dist.all_reduce(t)
print("env", *(os.environ[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")), "sum", t.item())
dist.destroy_process_group()
"""


def _ours(pid_before: set) -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in pid_before]


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes (2 CPUs each) on this machine, this test process connected to read Ray's
    state; every process it started is gone after the module."""
    from ray.cluster_utils import Cluster

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    environ = dict(os.environ)  # ray.init sets PYTHONBREAKPOINT here; later tests' kernels must not inherit it
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    started = [p.pid for p in _ours(before)]
    assert started
    yield c
    ray.shutdown()
    c.shutdown()
    os.environ.clear()
    os.environ.update(environ)
    assert wait_until(lambda: not [pid for pid in started if psutil.pid_exists(pid)
                                   and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], 30), \
        "a Ray process of the test cluster outlived it"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    k = Kernel(cwd=str(tmp_path_factory.mktemp("nb")), env=env).load_nbddp()
    yield k
    k.shutdown()


def launch_procs(log_dir: str) -> list[int]:
    """torchrun, ranks, the driver of one launch: the processes whose command line names its log folder."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if log_dir in " ".join(proc.info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def ray_leftovers() -> list[str]:
    """NodeAgent actors alive and placement groups not removed, as the cluster's GCS lists them."""
    from ray._private import state

    actors = [f"actor {a['ActorID']}" for a in state.actors().values()
              if a.get("State") != "DEAD" and "NodeAgent" in str(a.get("ActorClassName", ""))]
    groups = [f"placement group {g['placement_group_id']} {g['state']}"
              for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    return actors + groups


def assert_nothing_left(kernel, log_dir: str | None = None):
    log_dir = log_dir or kernel.ok("print(_ddp.log_dir)").stdout.strip()
    assert wait_until(lambda: not launch_procs(log_dir), 20), f"left: {launch_procs(log_dir)}"
    assert wait_until(lambda: not ray_leftovers(), 20), ray_leftovers()
    assert not ray_processes(kernel)


def ray_processes(kernel) -> list[str]:
    """Ray's own processes (GCS, raylet, workers) and the launch's driver under the kernel."""
    found = []
    for proc in kernel.descendants():
        try:
            words = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if re.search(r"gcs_server|raylet|ray::|ray/_private|nbddp\.raynode", words):
            found.append(words[:200])
    return found


TRAIN = ALL_REDUCE.replace("dist.destroy_process_group()", """\
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(torch.nn.Linear(4, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
w = model.module.weight.detach().clone(); dist.all_reduce(w); w /= dist.get_world_size()
print("trained", bool(torch.allclose(w, model.module.weight)))
dist.destroy_process_group()""")


def test_two_nodes_one_torchrun_each_meet_and_reduce(cluster, kernel):
    reply = kernel.ok(f"%%ddp --launcher ray --ray-address {cluster.address} -n 4 --nnodes 2\n" + TRAIN,
                      timeout=240)
    for rank in range(4):  # torchrun's environment on each node: its group rank, its local rank
        assert f"[rank{rank}]:env {rank} {rank % 2} {rank // 2} 4 sum 10.0\n" in reply.stdout, reply.text
        assert f"[rank{rank}]:trained True\n" in reply.stdout, reply.text  # DDP kept the replicas equal
    kernel.ok("assert _ddp.ok and [(r.rank, r.node_rank, r.state) for r in _ddp.ranks] == "
              "[(0, 0, 'ok'), (1, 0, 'ok'), (2, 1, 'ok'), (3, 1, 'ok')], _ddp.summary()")
    nodes = json.loads(kernel.ok("print(open(_ddp.log_dir + '/ray-nodes.json').read())").stdout)
    assert len({n["pid"] for n in nodes["nodes"]}) == 2
    assert "local Ray" not in reply.stdout + reply.stderr
    assert_nothing_left(kernel)


def test_a_failing_rank_on_the_second_node_fails_the_cell(cluster, kernel):
    reply = kernel.execute(f"%%ddp --launcher ray --ray-address {cluster.address} --nnodes 2 --nproc-per-node 1\n"
                           "import os, time\nif os.environ['GROUP_RANK'] == '1':\n    raise ValueError('bad shard')\n"
                           "time.sleep(60)\n", timeout=240)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    assert "[rank1]:ValueError: bad shard" in plain(reply.stderr), reply.text
    shown = "\n".join(reply.error["traceback"])
    assert "rank 1: failed (ValueError: bad shard at cell line 4)" in shown, shown
    assert reply.elapsed < 55, reply.elapsed  # rank 0 was stopped, not waited for
    assert_nothing_left(kernel)


def test_timeout_shows_each_ranks_stack_and_stops_every_node(cluster, kernel):
    reply = kernel.execute(f"%%ddp --launcher ray --ray-address {cluster.address} --nnodes 2 --nproc-per-node 1 "
                           "--timeout 35\nimport time\nprint('in', flush=True)\ntime.sleep(300)\n", timeout=240)
    assert reply.error and reply.error["ename"] == "DDPTimeout", reply.text
    assert reply.stderr.count("blocked at cell line 4: time.sleep(300)") >= 1, reply.text
    for rank in range(2):
        assert f"[rank{rank}]:in" in reply.stdout, reply.text
    kernel.ok("assert all('time.sleep(300)' in r.stack for r in _ddp.ranks), [r.stack for r in _ddp.ranks]")
    assert_nothing_left(kernel)


def test_interrupt_stops_every_node(cluster, kernel):
    reply, pressed = kernel.interrupted_when(
        f"%%ddp --launcher ray --ray-address {cluster.address} --nnodes 2 --nproc-per-node 1\n"
        "import os, time\nprint('PID', os.getpid(), flush=True)\ntry:\n    time.sleep(300)\n"
        "except KeyboardInterrupt:\n    print('saved', flush=True)\n    raise\n",
        lambda r: r.stdout.count("PID ") == 2, timeout=240)
    assert reply.error and reply.error["ename"] == "KeyboardInterrupt", reply.text
    for rank in range(2):  # SIGINT reached both nodes' ranks: the cell's own handler ran
        assert f"[rank{rank}]:saved" in reply.stdout, reply.text
    assert time.monotonic() - pressed < 30
    assert_nothing_left(kernel)


def test_a_killed_kernel_takes_the_launch_with_it(cluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    k = Kernel(cwd=str(tmp_path), env=env)
    try:
        k.ok("%load_ext nbddp")
        msg_id = k.kc.execute(f"%%ddp --launcher ray --ray-address {cluster.address} --nnodes 2 --nproc-per-node 1\n"
                              "import os, time\nprint('PID', os.getpid(), flush=True)\ntime.sleep(300)\n")
        pids = []

        def on_output(reply):
            pids[:] = [int(p) for p in re.findall(r"PID (\d+)", reply.stdout)]
            if len(pids) == 2:
                raise TimeoutError  # stop collecting: both nodes' ranks run
        with pytest.raises(TimeoutError):
            k.collect(msg_id, timeout=240, on_output=on_output)
        torchrun_args = psutil.Process(pids[0]).parent().cmdline()  # the launch's folder: its --log-dir's parent
        log_dir = os.path.dirname(next(w for w in torchrun_args if w.startswith("--log-dir="))[len("--log-dir="):])
        os.kill(k.pid, signal.SIGKILL)
        assert wait_until(lambda: not launch_procs(log_dir), 60), f"left: {launch_procs(log_dir)}"
        assert wait_until(lambda: not ray_leftovers(), 30), ray_leftovers()
    finally:
        k.shutdown()


def test_a_local_ray_is_started_for_the_cell_and_stopped(kernel):
    reply = kernel.ok("%%ddp --launcher ray -n 2\n" + ALL_REDUCE, timeout=240)
    for rank in range(2):
        assert f"[rank{rank}]:env {rank} {rank} 0 2 sum 3.0\n" in reply.stdout, reply.text
    assert "a local Ray is started for this cell and stopped after it" in reply.stdout + reply.stderr, reply.text
    log_dir = kernel.ok("print(_ddp.log_dir)").stdout.strip()
    assert wait_until(lambda: not launch_procs(log_dir), 20), launch_procs(log_dir)
    # the local Ray's GCS, raylet and workers went with the driver
    assert wait_until(lambda: not ray_processes(kernel), 20), ray_processes(kernel)


def test_usage_errors_before_anything_starts(kernel):
    port = free_port()
    for line, words in [(f"--launcher ray --ray-address 127.0.0.1:{port}", "cannot be reached"),
                        ("--launcher ray --ray-address 'not an address'", "--ray-address takes HOST:PORT"),
                        ("--ray-address 127.0.0.1:6379", "use them together"),
                        ("--launcher ray --nnodes 2", "a local Ray is one node")]:
        reply = kernel.execute(f"%%ddp {line}\nprint(1)")
        assert reply.status == "error" and "UsageError: %%ddp:" in reply.stderr, (line, reply.text)
        assert words in reply.stderr and reply.stderr.count("\n") == 1, reply.stderr
    reply = kernel.execute("import sys; sys.modules['ray'] = None  # as where Ray is not installed\n"
                           "try:\n    get_ipython().run_cell_magic('ddp', '--launcher ray', 'print(1)')\n"
                           "finally:\n    del sys.modules['ray']\n")
    assert 'pip install "nbddp[ray]"' in reply.stderr, reply.text
    reply = kernel.execute("%ddp_pool start --launcher ray -n 2")
    assert reply.status == "error" and "a pool runs on the local launcher only" in reply.stderr, reply.text
    assert not ray_processes(kernel)


def test_exported_ray_job_runs_the_script_with_one_torchrun_per_node(cluster, kernel, tmp_path):
    reply = kernel.ok(f"%%ddp_export {tmp_path}/job.py --nnodes 2 --nproc-per-node 1 --ray\n" + ALL_REDUCE)
    assert f"wrote {tmp_path}/job_ray.py; submit it to a Ray cluster from {tmp_path}/ with: " \
           "ray job submit --working-dir . -- python job_ray.py" in reply.stdout, reply.text
    # what `ray job submit` runs: the entrypoint in the uploaded folder, RAY_ADDRESS set to the cluster
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    job = subprocess.run([sys.executable, "job_ray.py"], cwd=tmp_path, env=dict(env, RAY_ADDRESS=cluster.address),
                         capture_output=True, text=True, timeout=240)
    assert job.returncode == 0, job.stdout + job.stderr
    for rank in range(2):
        assert f"[rank{rank}]:env {rank} 0 {rank} 2 sum 3.0\n" in job.stdout, job.stdout + job.stderr
    assert wait_until(lambda: not ray_leftovers(), 20), ray_leftovers()
    reply = kernel.execute("%%ddp --ray\nprint(1)")
    assert "--ray writes a Ray job next to the exported script" in reply.stderr, reply.text


def test_a_cluster_that_cannot_place_every_node_says_what_it_has(cluster, kernel):
    reply = kernel.execute(f"%%ddp --launcher ray --ray-address {cluster.address} --nnodes 3 --rdzv-timeout 5\n"
                           "print('ran')\n", timeout=120)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    shown = "\n".join(reply.error["traceback"]) + reply.stdout + reply.stderr
    assert "the Ray cluster cannot place 3 bundle(s) of {'CPU': 1} on 3 different node(s) within 5 s" in shown, shown
    assert "it has 2 node(s) alive" in shown, shown
    assert "rank 0: failed (never started (the Ray driver ended before this rank ran))" in shown, shown
    assert "]:ran" not in reply.stdout
    assert_nothing_left(kernel)
