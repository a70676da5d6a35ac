"""%ddp_export / %%ddp --export: the exported script, run with the exact torchrun command that
nbddp printed, gives each rank the same output as the cell gave in the notebook."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from support.helpers import free_port
from support.kernel import Kernel

CELL = """import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)
print("rank", os.environ["RANK"], "local", os.environ["LOCAL_RANK"], "world", os.environ["WORLD_SIZE"],
      "sum", t.item(), "omp", os.environ.get("OMP_NUM_THREADS"))
print("argv", sys.argv[1:], "name", __name__, "greeting", os.environ.get("GREETING"),
      "hub", os.environ.get("JUPYTERHUB_API_TOKEN"))
print("cwd", os.path.basename(os.getcwd()))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A kernel whose working directory is a fresh folder (where the scripts are written)."""
    folder = tmp_path_factory.mktemp("job")
    k = Kernel(cwd=str(folder), env=dict(os.environ, JUPYTERHUB_API_TOKEN="hub-secret"))  # #37.5: not for ranks
    k.ok("%load_ext nbddp")
    yield k, folder
    k.shutdown()


def printed_commands(stdout: str) -> list[str]:
    """The torchrun command lines nbddp printed after 'run it with torchrun:'."""
    after = stdout.split("run it with torchrun:\n", 1)[1]
    commands = []
    for line in after.splitlines():
        line = line.strip()
        match = re.match(r"^(?:node (\d+): )?(.*(?:torchrun|torch\.distributed\.launch) .*)$", line)
        if match:
            commands.append(match.group(2))
    return commands


def run_command(command: str, cwd, log_dir) -> subprocess.Popen:
    """Start the printed command as a user would in a shell on that node. torchrun reads its
    options from PET_* variables too: these only send each rank's output to its own file."""
    env = dict(os.environ, PET_LOG_DIR=str(log_dir), PET_REDIRECTS="3")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.Popen(command, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def rank_outputs(log_dir, ranks_per_node: int) -> dict[int, str]:
    """{local rank: stdout} from torchrun's per-rank log files."""
    out = {}
    for local in range(ranks_per_node):
        files = glob.glob(os.path.join(str(log_dir), "*", "attempt_0", str(local), "stdout.log"))
        assert len(files) == 1, (local, files)
        with open(files[0]) as f:
            out[local] = f.read()
    return out


def finish(proc, timeout=120) -> str:
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        text, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish: {text[-3000:]}") from None
    assert proc.returncode == 0, text[-3000:]
    return text


def test_exported_script_gives_the_cells_output_under_torchrun(job, tmp_path):
    kernel, folder = job
    reply = kernel.ok("%%ddp -n 2 --env GREETING=hi --export job.py -- --lr 0.5\n" + CELL, timeout=120)
    assert "nbddp: wrote job.py; run it with torchrun:" in reply.stdout, reply.text
    in_cell = json.loads(kernel.ok("import json; print(json.dumps([r.stdout for r in _ddp.ranks]))").stdout)
    assert "sum 3.0" in in_cell[0] and "argv ['--lr', '0.5'] name __main__ greeting hi hub None" in in_cell[1], in_cell
    [shown] = printed_commands(reply.stdout)  # --env values masked in the notebook, in the 0600 script
    assert shown == "GREETING=*** torchrun --nnodes=1 --nproc-per-node=2 --standalone job.py --lr 0.5", shown
    command = shown.replace("***", "hi")
    script = (folder / "job.py").read_text()
    assert script.startswith("# %%ddp -n 2 --env GREETING=hi -- --lr 0.5\nimport os, sys"), script[:200]
    assert f"#   {command}" in script and os.stat(folder / "job.py").st_mode & 0o777 == 0o600
    finish(run_command(command, folder, tmp_path / "logs"))
    assert rank_outputs(tmp_path / "logs", 2) == dict(enumerate(in_cell))


def test_export_of_the_last_cell_for_two_nodes_runs_as_two_torchruns(job, tmp_path):
    kernel, folder = job
    kernel.ok("%%ddp --nnodes 2 -n 2\n" + CELL, timeout=120)  # two simulated nodes of one rank
    in_cell = json.loads(kernel.ok("import json; print(json.dumps([r.stdout for r in _ddp.ranks]))").stdout)
    assert "rank 1 local 0 world 2 sum 3.0 omp None\n" in in_cell[1], in_cell  # as torchrun: 1 rank/node
    port = free_port()
    reply = kernel.ok(f"%ddp_export two.py --nnodes 2 -n 2 --master-port {port}")
    commands = printed_commands(reply.stdout)
    assert commands == [f"torchrun --nnodes=2 --nproc-per-node=1 --master-addr=localhost --master-port={port} "
                        f"--node-rank={n} two.py" for n in (0, 1)], reply.stdout
    assert "--master-addr must be node 0's address" in reply.stdout
    nodes = [run_command(c, folder, tmp_path / f"node{n}") for n, c in enumerate(commands)]
    for proc in nodes:
        finish(proc)
    for n in (0, 1):
        assert rank_outputs(tmp_path / f"node{n}", 1) == {0: in_cell[n]}


def test_legacy_cell_exports_for_torch_distributed_launch(job, tmp_path):
    kernel, folder = job
    cell = ("import argparse, os\np = argparse.ArgumentParser(); p.add_argument('--local-rank', type=int)\n"
            "args = p.parse_args()\nprint('local', args.local_rank, os.environ['LOCAL_RANK'])\n")
    reply = kernel.ok("%%ddp -n 2 --legacy-launch --export old.py\n" + cell)
    in_cell = json.loads(kernel.ok("import json; print(json.dumps([r.stdout for r in _ddp.ranks]))").stdout)
    assert in_cell == ["local 0 0\n", "local 1 1\n"], in_cell
    [command] = printed_commands(reply.stdout)
    assert command.startswith("python -m torch.distributed.launch --nnodes=1 --nproc-per-node=2"), command
    assert "read int(os.environ['LOCAL_RANK']) instead" in (folder / "old.py").read_text()
    finish(run_command(command, folder, tmp_path / "logs"))
    assert rank_outputs(tmp_path / "logs", 2) == dict(enumerate(in_cell))


def test_legacy_cell_under_the_torchrun_launcher_gets_local_rank_in_argv(job):
    """... and, as every launcher's ranks, not the hub's API token the kernel has (#37.5)."""
    kernel, _ = job
    reply = kernel.ok("%%ddp --launcher torchrun -n 2 --legacy-launch\nimport os, sys\n"
                      "print('argv', sys.argv[1:], 'hub', os.environ.get('JUPYTERHUB_API_TOKEN'))\n", timeout=180)
    for r in (0, 1):
        assert f"[rank{r}]:argv ['--local-rank={r}'] hub None" in reply.stdout, reply.text


def test_bad_exports_are_usage_errors(job):
    kernel, folder = job
    for code, words in [("%ddp_export notes.txt", "must end in .py"),
                        ("%ddp_export", "usage: %ddp_export SCRIPT.py"),
                        ("%ddp_export x.py -n 0", "-n")]:
        reply = kernel.execute(code)
        assert reply.status == "error" and "UsageError" in reply.stderr, (code, reply.text)
        assert words in reply.stderr and reply.stderr.count("\n") == 1, (code, reply.stderr)
    # a syntax error is said as %%ddp says it (nbddp/core/launchrules.py check_cell), with the notebook's line
    reply = kernel.execute("%%ddp_export broken.py -n 2\nif True print(1)\n")
    assert reply.status == "error", reply.text
    assert reply.stderr.startswith("UsageError: %ddp_export: cell line 2 has a syntax error, so nothing was "
                                   "written:\n    if True print(1)\n"), reply.stderr
    assert not (folder / "broken.py").exists()
