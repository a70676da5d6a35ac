"""torchrun's command lines, one module for all four users (the torchrun launcher, the Slurm
launcher's node script, the exported Slurm job, %ddp_export's commands), and what torchrun's or
srun's log says when they fail. Pure: no kernel, no processes."""
import sys

import pytest

from nbddp import export
from nbddp.core import diagnosis, torchrun_cli
from nbddp.core.ddpline import parse_line
from nbddp.core.launch import Launch
from nbddp.sources.slurm import SlurmLaunch, node_script_text
from nbddp.sources.slurm_script import sbatch_text
from nbddp.sources.torchrun import ElasticLaunch


def spec(line):
    return parse_line(line)


# ------------------------------------------------------------------ options
def test_one_node_is_standalone():
    assert torchrun_cli.options(spec("--launcher torchrun -n 4")) == [
        "--nnodes=1", "--nproc-per-node=4", "--standalone"]


def test_c10d_endpoint_id_node_rank_timeout_and_restarts():
    s = spec("--launcher torchrun --nnodes 2 -n 4 --rdzv-endpoint head:29400 --rdzv-id job7 "
             "--node-rank 1 --rdzv-timeout 9.5 --max-restarts 3")
    assert torchrun_cli.options(s) == [
        "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400",
        "--rdzv-id=job7", "--node-rank=1", "--rdzv-conf=join_timeout=10", "--max-restarts=3"]


def test_static_master_names_addr_port_and_this_nodes_rank():
    s = spec("--launcher torchrun --nnodes 2 -n 4 --master-addr 10.0.0.1 --master-port 29511 --node-rank 0 "
             "--rdzv-timeout 5")
    assert torchrun_cli.options(s) == [
        "--nnodes=2", "--nproc-per-node=2", "--master-addr=10.0.0.1", "--master-port=29511",
        "--node-rank=0", "--rdzv-conf=timeout=5"]
    assert torchrun_cli.options(s, node_rank=1)[4] == "--node-rank=1"


def test_the_torchrun_launchers_agent_command(tmp_path):
    s = spec("--launcher torchrun -n 2 --max-restarts 1 -- --lr 0.5")
    launch = ElasticLaunch(Launch(s, source="pass", cwd=str(tmp_path), env_base={}), device_count=0)
    assert launch.options == torchrun_cli.options(s)
    cmd = torchrun_cli.agent_command(sys.executable, s, "/logs/x", "/nb/cell.py")
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                   "--standalone", "--max-restarts=1", "--tee=3", "--log-dir=/logs/x/torchrun",
                   "-m", "nbddp.rank.torchrun_rank", "/nb/cell.py", "--lr", "0.5"]


def test_meeting_port_is_the_endpoints_or_the_masters():
    assert torchrun_cli.meeting_port(spec("--launcher torchrun -n 2")) is None
    assert torchrun_cli.meeting_port(spec("--launcher torchrun --nnodes 2 --rdzv-endpoint h:29400")) == 29400
    assert torchrun_cli.meeting_port(spec("--launcher torchrun --nnodes 2 --rdzv-endpoint h")) is None
    assert torchrun_cli.meeting_port(spec("--launcher torchrun --master-port 29511 --node-rank 0 "
                                          "--nnodes 2")) == 29511


# ------------------------------------------------------------------- export
def test_export_one_node_command_quotes_env_and_arguments():
    s = spec("-n 4 --env GREETING='hi there' -- --name 'a b'")
    assert export.node_commands(s, "out/train.py") == [
        "GREETING='hi there' torchrun --nnodes=1 --nproc-per-node=4 --standalone out/train.py --name 'a b'"]


def test_export_static_multi_node_gets_torchruns_default_port_and_one_command_per_node():
    commands = export.node_commands(spec("--nnodes 2 -n 4"), "train.py")
    assert commands == [
        f"torchrun --nnodes=2 --nproc-per-node=2 --master-addr=localhost --master-port=29500 "
        f"--node-rank={node} train.py" for node in (0, 1)]


def test_export_c10d_commands_name_each_node_and_keep_restarts():
    commands = export.node_commands(spec("--launcher torchrun --nnodes 2 -n 2 --rdzv-endpoint h:1 "
                                         "--max-restarts 2"), "t.py")
    assert commands == [f"torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=h:1 "
                        f"--node-rank={node} --max-restarts=2 t.py" for node in (0, 1)]


def test_legacy_launch_exports_torch_distributed_launch():
    s = spec("-n 2 --legacy-launch")
    assert export.node_commands(s, "t.py") == [
        "python -m torch.distributed.launch --nnodes=1 --nproc-per-node=2 --standalone t.py"]
    assert torchrun_cli.module(s) == "torch.distributed.launch"
    assert torchrun_cli.module(spec("-n 2")) == "torch.distributed.run"


# -------------------------------------------------------------------- Slurm
SLURM_WORDS = ('--nnodes="$SLURM_NNODES" --nproc-per-node=4 --rdzv-backend=c10d '
               '--rdzv-endpoint="$head_node:$rdzv_port"')


def test_the_sbatch_job_runs_torchrun_with_the_jobs_node_count_and_endpoint():
    s = spec("--slurm --nnodes 2 -n 8 --max-restarts 1 --legacy-launch")
    text = sbatch_text(s, "train.py", python="/py")
    assert '  "$PYTHON" -m torch.distributed.launch \\' in text.splitlines()
    assert f"  {SLURM_WORDS} --max-restarts=1 --tee=3 \\" in text.splitlines()
    timed = sbatch_text(spec("--launcher torchrun --slurm --nnodes 2 -n 8 --rdzv-endpoint h:29400 --rdzv-timeout 29.2"),
                        "train.py")
    assert '  "$PYTHON" -m torch.distributed.run \\' in timed.splitlines()
    assert f"  {SLURM_WORDS} --tee=3 --no-python \\" in timed.splitlines()
    assert '  "$PYTHON" -c "$run_by_lines" train.py' in timed.splitlines()
    assert "RDZV_CONF_MORE=,join_timeout=30" in timed.splitlines()


def test_the_slurm_launchers_node_script_runs_the_same_options(tmp_path):
    s = spec("--launcher slurm --nnodes 2 -n 4 --max-restarts 1 -- --lr 1")
    launch = SlurmLaunch(Launch(s, source="pass", cwd=str(tmp_path), env_base={"PATH": ""}))
    assert launch.options == [
        '--nnodes="$SLURM_STEP_NUM_NODES"', "--nproc-per-node=2", "--rdzv-backend=c10d",
        '--rdzv-endpoint="$head_node:$rdzv_port"', "--max-restarts=1"]
    script = node_script_text(s, "/s", "/py", launch.options)
    assert ('exec /py -m torch.distributed.run --nnodes="$SLURM_STEP_NUM_NODES" --nproc-per-node=2 '
            '--rdzv-backend=c10d --rdzv-endpoint="$head_node:$rdzv_port" --max-restarts=1 \\\n  "$@"') in script
    assert "  export PET_RDZV_CONF=is_host=true\n" in script and "  export PET_RDZV_CONF=is_host=false\n" in script
    assert torchrun_cli.rank_entry("/l", "/c.py", s.script_args) == [
        "--tee=3", "--log-dir=/l/torchrun", "-m", "nbddp.rank.torchrun_rank", "/c.py", "--lr", "1"]


# ------------------------------------------------------- the agent's log
AGENT_LOG = """[2026-12-04 10:00:00] torch.distributed.elastic.multiprocessing.api: failed
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_10:00:00
  host      : node1
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 1234)
[1]:
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 1233)
"""


# As torch 2.13's ChildFailedError prints it: the ranks torchrun stopped itself (SIGTERM) under
# "Failures", before the root cause.
AGENT_LOG_STOPPED = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
runs/13/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_19:01:02
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4001)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4001
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_19:01:01
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4002)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4002
============================================================
"""


def test_agent_failures_are_read_from_torchruns_summary():
    assert diagnosis.agent_failures(AGENT_LOG) == [(3, 1, -9), (2, 0, 1)]
    assert diagnosis.agent_failures(AGENT_LOG_STOPPED) == [(1, 1, -9), (0, 0, -15)]  # root cause first
    assert diagnosis.agent_failures("all fine\n") == []


def test_agent_failure_names_a_rendezvous_timeout_and_what_to_do():
    s = spec("--launcher torchrun --nnodes 3 --rdzv-endpoint h:29400 --rdzv-timeout 20")
    text = diagnosis.agent_failure("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: \n",
                                   1, s, "/l/agent.log")
    assert text.startswith("rendezvous timed out: not all 3 nodes joined at h:29400 within 20 s")
    assert "on the other nodes with the same --nnodes" in text and text.endswith("torchrun's log: /l/agent.log")


def test_agent_failure_is_its_last_error_line():
    s = spec("--launcher torchrun -n 2")
    log = "starting\nValueError: first\nusage: torchrun [-h]\ntorchrun: error: unrecognized arguments\nbye\n"
    assert diagnosis.agent_failure(log, 2, s, "/l/agent.log") == (
        "torchrun exited with code 2: torchrun: error: unrecognized arguments (torchrun's log: /l/agent.log)")
    assert diagnosis.agent_failure("just this\n", 1, s, "/a") == \
        "torchrun exited with code 1: just this (torchrun's log: /a)"


def test_srun_errors_name_srun_as_the_failed_agent():
    lines = ["[rank0]: hi\n", "srun: error: Unable to allocate resources: Invalid partition name specified\n",
             "srun: error: second\n"]
    errors = diagnosis.srun_errors(lines)
    assert errors == [line.strip() for line in lines[1:]]
    assert diagnosis.srun_failure(errors, 1, "/l/agent.log") == (
        "srun exited with code 1: Unable to allocate resources: Invalid partition name specified "
        "(srun's log: /l/agent.log)")


@pytest.mark.parametrize("addr, this_machine", [("localhost", True), ("127.0.0.1", True), ("::1", True),
                                                 ("10.0.0.1", False), ("node0.cluster", False)])
def test_the_export_says_a_loopback_master_addr_only_works_on_this_machine_and_only_then(addr, this_machine):
    note = export._addr_note(spec(f"--nnodes 2 -n 4 --master-addr {addr}"))
    assert "must be node 0's address" in note
    assert ("only works when all nodes are this machine" in note) == this_machine, note
