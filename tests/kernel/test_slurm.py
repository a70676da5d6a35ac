"""Slurm: the exported sbatch job and ``%%ddp --launcher slurm`` against a real Slurm
(scripts/setup-slurm.sh: slurmctld + one or two slurmd on this machine). (The sbatch text alone:
tests/unit/test_sbatch_text.py.)"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from nbddp.core.ddpline import parse_line
from nbddp.sources.slurm_script import sbatch_text
from support.helpers import alive, wait_until
from support.kernel import Kernel


def slurm_answers() -> bool:
    """sinfo exists and its controller answers (installed but stopped, e.g. after
    ``scripts/setup-slurm.sh stop``, does not count)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


HAVE_SLURM = slurm_answers()
needs_slurm = pytest.mark.skipif(not HAVE_SLURM and os.environ.get("CI") != "true",
                                 reason="no Slurm answers here; bash scripts/setup-slurm.sh installs and starts one")

CELL = """import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)
print("rank", os.environ["RANK"], "local", os.environ["LOCAL_RANK"], "group", os.environ["GROUP_RANK"],
      "world", os.environ["WORLD_SIZE"], "sum", t.item(), "omp", os.environ.get("OMP_NUM_THREADS"))
print("argv", sys.argv[1:], "name", __name__, "greeting", os.environ.get("GREETING"),
      "hub", os.environ.get("JUPYTERHUB_API_TOKEN"))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("kernel_python, given, runs", [
    (sys.executable, None, sys.executable),          # the exporting kernel's interpreter, where it exists
    ("/nowhere/venv/bin/python", None, "python"),    # a path this node lacks: python from PATH
    (sys.executable, "env/bin/python", "env/bin/python"),  # PYTHON= at submission wins (a link to this one)
])
def test_the_job_runs_the_kernels_interpreter_where_it_exists(tmp_path, kernel_python, given, runs):
    """The job's own shell text runs under bash; ``srun`` and ``scontrol`` are stand-ins that only
    write down the command line Slurm would have run, so no Slurm is needed."""
    text = sbatch_text(parse_line("--slurm -n 2"), "train.py", "-n 2", python=kernel_python)
    assert f"kernel_python={kernel_python}" in text.splitlines()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "train.sbatch").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", SRUN_ARGS=str(tmp_path / "args"),
               SLURM_JOB_NODELIST="node0", SLURM_JOB_ID="7", SLURM_NNODES="1", SLURM_CPUS_PER_TASK="2")
    if given:  # the job runs it too, to find a free rendezvous port on its first node
        (tmp_path / given).parent.mkdir(parents=True)
        (tmp_path / given).symlink_to(sys.executable)
        env["PYTHON"] = given
    subprocess.run(["bash", "train.sbatch"], cwd=tmp_path, env=env, check=True, timeout=30)
    argv = (tmp_path / "args").read_text().splitlines()
    assert argv[argv.index("-m") - 1:][:3] == [runs, "-m", "torch.distributed.run"], argv


# ------------------------------------------------------------------- against real Slurm
def nodes() -> int:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    return len(out)


def jobs() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout.splitlines()


def jobs_after_end(timeout: float = 10) -> list[str]:
    """Jobs still listed once a finished job's COMPLETING moment (slurmd's cleanup) had time to pass."""
    wait_until(lambda: not jobs(), timeout, every=0.2)
    return jobs()


def steps(job_id: str) -> list[str]:
    """The job's steps that run a cell (not Slurm's own extern/batch steps)."""
    out = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], capture_output=True, text=True).stdout
    return [s for s in out.split() if re.match(r"^\d+\.\d+$", s)]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    if not HAVE_SLURM:
        pytest.fail("CI=true but no Slurm answers: scripts/test.sh runs scripts/setup-slurm.sh")
    folder = tmp_path_factory.mktemp("slurmjob")
    k = Kernel(cwd=str(folder), env=dict(os.environ, JUPYTERHUB_API_TOKEN="hub-secret"))  # #37.5: not for ranks
    k.ok("%load_ext nbddp")
    yield k, folder
    k.shutdown()


def raised(reply, name: str) -> str:
    """The cell's exception text, after checking the cell raised ``name``."""
    assert reply.error and reply.error["ename"] == name, reply.text
    return reply.error["evalue"]


def in_cell(kernel) -> list[str]:
    return json.loads(kernel.ok("import json; print(json.dumps([r.stdout for r in _ddp.ranks]))").stdout)


def submit(folder, name: str, log_dir) -> subprocess.Popen:
    """``sbatch --wait`` as a user submits it, without PYTHON (the job finds the kernel's
    interpreter itself); PET_* only sends each rank's output to its own file."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env.update(PET_LOG_DIR=str(log_dir), PET_REDIRECTS="3", JUPYTERHUB_API_TOKEN="hub-secret")  # unset by the job
    return subprocess.Popen(["sbatch", "--wait", f"{name}.sbatch"], cwd=folder, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def rank_outputs(log_dir) -> dict[int, str]:
    """{global rank: stdout} from every node's torchrun log files."""
    out = {}
    for root, _, files in os.walk(log_dir):
        if "stdout.log" in files:
            with open(os.path.join(root, "stdout.log")) as f:
                text = f.read()
            out[int(text.split()[1])] = text
    return out


@needs_slurm
def test_exported_sbatch_job_gives_each_rank_the_cells_output(job, tmp_path):
    kernel, folder = job
    two = nodes() >= 2
    reply = kernel.ok("%%ddp -n 2 --env GREETING=hi --export one.py --slurm -- --lr 0.5\n" + CELL, timeout=120)
    assert "nbddp: wrote one.sbatch; submit it from" in reply.stdout, reply.text
    expected = {"one": dict(enumerate(in_cell(kernel)))}
    if two:  # the multi-node path: two nodes of one rank, from %ddp_export of the last cell
        kernel.ok("%%ddp --nnodes 2 -n 2 --env GREETING=hi -- --lr 0.5\n" + CELL, timeout=120)
        expected["two"] = dict(enumerate(in_cell(kernel)))
        reply = kernel.ok("%ddp_export two.py --slurm")
        assert "#SBATCH --nodes=2" in (folder / "two.sbatch").read_text()
    assert "rank 1 local 1 group 0 world 2 sum 3.0 omp 1" in expected["one"][1], expected
    assert "greeting hi hub None" in expected["one"][1], expected  # the kernel's hub token stays out
    assert not two or "rank 1 local 0 group 1 world 2 sum 3.0 omp None" in expected["two"][1], expected
    runs = {name: submit(folder, name, tmp_path / name) for name in expected}
    for name, proc in runs.items():
        text, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, text, [p.read_text() for p in folder.glob(f"{name}-*.out")])
        assert rank_outputs(tmp_path / name) == expected[name], name
    assert not jobs_after_end()


@needs_slurm
def test_a_slurm_cell_runs_on_every_node(job):
    kernel, _ = job
    n = min(nodes(), 2)
    reply = kernel.ok(f"%%ddp --launcher slurm --nnodes {n} -n {n} -- --lr 1\n" + CELL +
                      "print('node', os.environ['SLURMD_NODENAME'])\n", timeout=240)
    assert "Slurm: srun + torchrun per node" in reply.stdout, reply.text
    for r in range(n):
        assert f"[rank{r}]:rank {r} local 0 group {r} world {n} sum {n * (n + 1) / 2}" in reply.stdout, reply.text
        assert f"[rank{r}]:argv ['--lr', '1'] name __main__ greeting None hub None" in reply.stdout, reply.text
    outputs = in_cell(kernel)
    assert len({line for out in outputs for line in out.splitlines() if line.startswith("node ")}) == n, outputs
    assert not jobs_after_end()


@needs_slurm
def test_a_failing_rank_raises_ddperror_with_its_cause(job):
    kernel, folder = job
    # rank 1 fails once rank 0 has printed (else torchrun may stop rank 0 before it prints)
    reply = kernel.execute("%%ddp --launcher slurm -n 2\nimport os, time\nif os.environ['RANK'] == '1':\n"
                           "    while not os.path.exists('rank0.done'): time.sleep(0.05)\n"
                           "    raise ValueError('boom')\nprint('fine', os.environ['RANK'], flush=True)\n"
                           "open('rank0.done', 'w').close()\n", timeout=240)
    (folder / "rank0.done").unlink(missing_ok=True)
    assert "rank 1: failed (ValueError: boom at cell line 5)" in raised(reply, "DDPError"), reply.error
    assert "[rank0]:fine 0" in reply.stdout, reply.text
    assert not jobs_after_end()


@needs_slurm
def test_interrupt_cancels_the_job(job):
    kernel, _ = job
    msg_id = kernel.kc.execute("%%ddp --launcher slurm -n 1\nimport os, time\n"
                               "print('PID', os.getpid(), flush=True)\ntry:\n    time.sleep(300)\n"
                               "except KeyboardInterrupt:\n    time.sleep(0.3)\n    print('saved', flush=True)\n"
                               "    raise\n")
    sent = []

    def on_output(reply):
        if "PID " in reply.stdout and not sent:
            sent.append(time.monotonic())
            kernel.km.interrupt_kernel()

    reply = kernel.collect(msg_id, timeout=240, on_output=on_output)
    assert sent, reply.text
    raised(reply, "KeyboardInterrupt")
    assert "[rank0]:saved" in reply.stdout, reply.text  # SIGINT first, once: the cell's handler ran
    assert not jobs(), "the job outlived the interrupt"
    pid = int(re.search(r"PID (\d+)", reply.stdout).group(1))
    assert not alive([pid]), "the rank outlived the interrupt"
    assert time.monotonic() - sent[0] < 20


@needs_slurm
def test_timeout_stops_the_job_and_a_bad_partition_is_srun_s_error(job):
    kernel, _ = job
    reply = kernel.execute("%%ddp --launcher slurm -n 1 --timeout 20 --idle-warning 0\nimport time\n"
                           "print('waiting', flush=True)\ntime.sleep(300)\n", timeout=240)
    raised(reply, "DDPTimeout")
    assert "rank 0 blocked at cell line 4: time.sleep(300)" in reply.text, reply.text
    assert not jobs(), "the job outlived the timeout"
    reply = kernel.execute("%%ddp --launcher slurm -n 2 --partition nosuch\nprint(1)\n", timeout=120)
    text = raised(reply, "DDPError")
    assert "srun exited with code 1: invalid partition specified: nosuch" in text, text
    assert "rank 0: failed (never started (srun ended before this rank ran))" in text, text


@needs_slurm
def test_inside_an_allocation_the_cell_is_a_step_of_it(tmp_path):
    """As in a notebook started inside ``salloc``: the kernel has the allocation's SLURM_* variables."""
    if not HAVE_SLURM:
        pytest.fail("CI=true but Slurm is not installed")
    made = subprocess.run(["salloc", "--no-shell", "-N", "1", "-c", "2", "-J", "nbddp-test-alloc"],
                          capture_output=True, text=True, timeout=60)
    job_id = re.search(r"Granted job allocation (\d+)", made.stderr).group(1)
    env = dict(os.environ, SLURM_JOB_ID=job_id, SLURM_NNODES="1", SLURM_NTASKS="1")
    k = Kernel(cwd=str(tmp_path), env=env)
    try:
        k.ok("%load_ext nbddp")
        reply = k.ok("%%ddp --launcher slurm -n 2\nimport os\n"
                     "print('in job', os.environ['SLURM_JOB_ID'], 'step', os.environ['SLURM_STEP_ID'])\n", timeout=240)
        for r in (0, 1):
            assert f"[rank{r}]:in job {job_id} step 0" in reply.stdout, reply.text
        assert jobs() == [f"{job_id} nbddp-test-alloc RUNNING"], jobs()  # the allocation stays, for the next cell
        # the kernel's exit while a cell runs: its step is cancelled, the allocation stays
        k.kc.execute("%%ddp --launcher slurm -n 1\nimport time\nprint('up', flush=True)\ntime.sleep(300)\n")
        assert wait_until(lambda: steps(job_id), 120, every=0.5), "the cell's step never started"
        k.km.shutdown_kernel(now=False)
        assert wait_until(lambda: not steps(job_id), 20, every=0.5), "the cell's step outlived the kernel"
        assert jobs() == [f"{job_id} nbddp-test-alloc RUNNING"], jobs()
    finally:
        k.shutdown()
        subprocess.run(["scancel", job_id])


@needs_slurm
def test_a_taken_rendezvous_port_stops_the_slurm_cell_in_one_line(job):
    """#37.1: the step's first node hosts the store; a port someone holds there is said, not joined."""
    kernel, _ = job
    import socket
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        reply = kernel.execute(f"%%ddp --launcher slurm -n 1 --master-port {port}\nprint('the cell ran')\n",
                               timeout=120)
    text = raised(reply, "DDPError")
    assert f"the rendezvous port {port} on " in text and "is taken (Address already in use)" in text, text
    assert "the cell ran" not in reply.stdout
    assert not jobs_after_end()


@needs_slurm
def test_the_exported_job_keeps_every_ranks_line_in_ten_runs(tmp_path):
    """#37.15: the ranks of a node share srun's stream; under PYTHONUNBUFFERED (set by many images,
    and passed on by sbatch) a print lands in pieces, and two ranks' pieces interleaved into lines
    that matched neither rank. The job has torchrun copy each rank's output by lines (--tee=3). A
    tiny job (two ranks that only print: no torch in them) run 10 times at once: every rank's
    lines whole in every .out, every job exits 0. test_exported_sbatch_job_gives_each_rank_the_cells_output
    runs the two-node job."""
    import io

    from nbddp.export import export_cell

    if not HAVE_SLURM:
        pytest.fail("CI=true but no Slurm answers: scripts/test.sh runs scripts/setup-slurm.sh")
    n, lines = 1, 100  # the ranks of one node are where lines met; 10 torchruns, not 20, keep it cheap
    export_cell(str(tmp_path / "tiny.py"), f"import os\nfor i in range({lines}):\n"
                "    print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'line', i)\n",
                "--slurm -n 2", out=io.StringIO())
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    runs = [subprocess.Popen(["sbatch", "--wait", f"--output=run{i}.out", "tiny.sbatch"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) for i in range(10)]
    codes = [proc.wait(timeout=300) for proc in runs]
    took = time.monotonic() - start
    outs = [(tmp_path / f"run{i}.out").read_text() for i in range(10)]
    assert codes == [0] * 10, (codes, outs)
    want = sorted(f"[rank{r}]:rank {r} of {2 * n} line {i}" for r in range(2 * n) for i in range(lines))
    for text in outs:
        assert sorted(line for line in text.splitlines() if "rank " in line) == want, text
    assert not jobs_after_end()
    print(f"10 jobs in {took:.1f} s")
