"""The exported Slurm job's sbatch text, pure: it asks for the cell's shape and runs torchrun on each
node, the user's sbatch lines win over nbddp's, and bad Slurm options are usage errors. (The job
and ``%%ddp --launcher slurm`` against a real Slurm: tests/kernel/test_slurm.py.) Nothing ``squeue``
shows makes a job's rendezvous (issue #37.1; the rendezvous run: tests/kernel/test_slurm_rendezvous.py)."""
import re

import pytest

from nbddp import DDPUsageError
from nbddp.core.ddpline import parse_line
from nbddp.core.launch import Launch
from nbddp.sources.slurm import SlurmLaunch, node_script_text
from nbddp.sources.slurm_script import sbatch_options, sbatch_text


def test_sbatch_text_asks_for_the_cells_shape_and_runs_torchrun_per_node():
    spec = parse_line("--slurm --nnodes 2 -n 8 --env GREETING='hi there' --time 30 --partition debug "
                      "--account proj -- --lr 0.5")
    text = sbatch_text(spec, "out/train.py", "--nnodes 2 -n 8")
    assert text.startswith("#!/bin/bash\n# Exported by nbddp from the cell `%%ddp --nnodes 2 -n 8`.")
    for line in ("#SBATCH --job-name=train", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --time=30", "#SBATCH --partition=debug",
                 "#SBATCH --account=proj", "#SBATCH --output=%x-%j.out",
                 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                 "export GREETING='hi there'", 'if [ -z "${PYTHON:-}" ]; then',
                 '--nnodes="$SLURM_NNODES" --nproc-per-node=4 --rdzv-backend=c10d '
                 '--rdzv-endpoint="$head_node:$rdzv_port" --tee=3 --no-python',
                 '  "$PYTHON" -c "$run_by_lines" train.py --lr 0.5'):
        assert line in text.splitlines() or f"  {line} \\" in text, (line, text)
    assert "gpus-per-node" not in text  # a gloo cell asks for no GPUs
    assert 'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1' in text


def test_sbatch_lines_win_over_ours_and_gpus_are_asked_for_nccl():
    spec = parse_line("--slurm -n 4 --backend nccl --sbatch '-c 16' --sbatch '#SBATCH --qos=high' "
                      "--sbatch=--output=logs/%j.txt")
    assert sbatch_options(spec, "job") == ["--job-name=job", "--nodes=1", "--ntasks-per-node=1",
                                           "--gpus-per-node=4", "-c 16", "--qos=high", "--output=logs/%j.txt"]
    text = sbatch_text(parse_line("--slurm -n 2 --rdzv-timeout 60 --max-restarts 2 --launcher torchrun"), "a.py")
    assert "RDZV_CONF_MORE=,join_timeout=60" in text.splitlines() and "--max-restarts=2 --tee=3 --no-python \\" in text


@pytest.mark.parametrize("line, words", [
    ("--slurm --time soon", "--time takes Slurm's"),
    ("--partition debug", "--partition is a Slurm option"),
    ("--slurm --sbatch qos=high", "--sbatch takes one sbatch option"),
    ("--launcher slurm --sbatch=--qos=high", "--sbatch lines are for the exported job"),
    ("--launcher slurm --rdzv-endpoint h:1", "--rdzv-endpoint is for a real multi-node job"),
])
def test_bad_slurm_options_are_usage_errors(line, words):
    with pytest.raises(DDPUsageError, match=re.escape(words)):
        parse_line(line)


def test_nothing_squeue_shows_makes_the_rendezvous(tmp_path):
    text = sbatch_text(parse_line("--slurm --nnodes 2 -n 2"), "train.py", python="/py")
    assert "SLURM_JOB_ID" not in text and "29500" not in text, text
    assert "--rdzv-id" not in text  # the id is in torchrun's environment, not its command line
    spec = parse_line("--launcher slurm --nnodes 2 -n 2")
    launch = SlurmLaunch(Launch(spec, source="pass", cwd=str(tmp_path), env_base={"PATH": ""}))
    scripts = [node_script_text(spec, "/s", "/py", launch.options) for _ in range(6)]
    for script in scripts:
        rdzv = [line for line in script.splitlines() if "rdzv" in line.lower() and not line.startswith("#")]
        assert not any("SLURM_JOB_ID" in line or "SLURM_STEP_ID" in line for line in rdzv), rdzv
        assert "--rdzv-id" not in script
    ids = {re.search(r"PET_RDZV_ID=([0-9a-f]{32})\n", s).group(1) for s in scripts}
    ports = {re.search(r"rdzv_port=(\d+)\n", s).group(1) for s in scripts}
    assert len(ids) == 6 and len(ports) > 1, (ids, ports)
    pinned = node_script_text(parse_line("--launcher slurm -n 1 --master-port 23456"), "/s", "/py", launch.options)
    assert "rdzv_port=23456\n" in pinned
