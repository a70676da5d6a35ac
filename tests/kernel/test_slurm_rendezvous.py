"""Issue #37.1: a Slurm job's c10d rendezvous is the job's own. Its id and port are random per job
(nothing ``squeue`` shows derives them), the id travels in torchrun's environment (not on the
command line ``ps`` shows), and the head node hosts the store explicitly, so a port someone took
first stops the job in one line instead of the agents joining that someone's store.

No Slurm needed: the exported job's shell text runs under bash with stand-ins for ``srun`` (runs
the task once per node) and ``scontrol``; real torchrun checks that ``is_host=true`` fails on a
taken port. tests/kernel/test_slurm.py runs the real thing on the local Slurm."""
import os
import re
import socket
import subprocess
import sys
import time

from nbddp.core import torchrun_cli
from nbddp.core.ddpline import parse_line
from nbddp.sources.slurm_script import sbatch_text

JOB_ID = "4242"


def listening() -> socket.socket:
    """A port someone else took first (as another user's process would)."""
    s = socket.socket()
    s.bind(("", 0))
    s.listen()
    return s


def fake_slurm(tmp_path) -> dict:
    """``srun`` that runs its command once per node (node0 first, as SLURMD_NODENAME says), a
    ``scontrol`` that lists both, and a PYTHON whose torchrun writes down what it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\n'
                                  'for n in node0 node1; do SLURMD_NODENAME=$n "$@" || exit; done\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node0\\nnode1\\n'\n")
    (bin_dir / "python").write_text(
        f'#!/bin/bash\nif [ "$1" = -I ]; then exec {sys.executable} "$@"; fi\n'
        '{ echo "conf=$PET_RDZV_CONF"; echo "id=$PET_RDZV_ID"; printf "%s\\n" "$@"; } '
        '> "$TORCHRUN_SAW.$SLURMD_NODENAME"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PET_", "RDZV"))}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON=str(bin_dir / "python"),
               TORCHRUN_SAW=str(tmp_path / "saw"), SLURM_JOB_NODELIST="node[0-1]", SLURM_JOB_ID=JOB_ID,
               SLURM_NNODES="2", SLURM_CPUS_PER_TASK="1")
    return env


def test_each_run_of_the_job_has_its_own_id_and_port_and_node0_hosts(tmp_path):
    (tmp_path / "train.sbatch").write_text(sbatch_text(parse_line("--slurm --nnodes 2 -n 2"), "train.py"))
    env = fake_slurm(tmp_path)
    seen = []
    for _ in range(2):  # the same job id twice: nothing of the rendezvous may repeat
        subprocess.run(["bash", "train.sbatch"], cwd=tmp_path, env=env, check=True, timeout=30)
        saw = {n: (tmp_path / f"saw.{n}").read_text().splitlines() for n in ("node0", "node1")}
        assert saw["node0"][0] == "conf=is_host=true" and saw["node1"][0] == "conf=is_host=false", saw
        assert saw["node0"][1:] == saw["node1"][1:], saw  # same id and endpoint on every node
        assert re.fullmatch(r"id=[0-9a-f]{32}", saw["node0"][1]), saw
        [endpoint] = [w for w in saw["node0"] if w.startswith("--rdzv-endpoint=")]
        seen.append((saw["node0"][1], endpoint))
    assert seen[0][0] != seen[1][0], seen
    assert seen[0][1] != seen[1][1] and all(e.startswith("--rdzv-endpoint=node0:") for _, e in seen), seen
    with listening() as taken:  # a port given with RDZV_PORT that someone holds: one clear line, no srun
        port = taken.getsockname()[1]
        done = subprocess.run(["bash", "train.sbatch"], cwd=tmp_path, env=dict(env, RDZV_PORT=str(port)),
                              capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert done.stderr.strip().startswith(f"nbddp: the rendezvous port {port} on "), done.stderr
    assert "is taken (Address already in use); choose another with RDZV_PORT=" in done.stderr, done.stderr


def test_the_head_node_hosting_a_taken_port_fails_instead_of_joining(tmp_path):
    """torch's own guess (no is_host) joins whatever listens on the port; nbddp's head node says
    is_host=true, and torchrun fails at once."""
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    conf = torchrun_cli.slurm_rdzv_conf(parse_line("-n 1"), "true")
    with listening() as taken:
        env = dict(os.environ, PET_RDZV_ID="x" * 32, PET_RDZV_CONF=conf)
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
                               "--rdzv-backend=c10d", f"--rdzv-endpoint=localhost:{taken.getsockname()[1]}",
                               str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "ran" not in done.stdout, done.stdout
    assert "RendezvousConnectionError" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - start < 30
