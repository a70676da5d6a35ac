"""Issue #37.5: ``--env`` values may be secrets, and so is the JupyterHub server's API token.
Exported files that hold ``--env`` values are 0600 (the values stay, so the files run as they
are), the notebook shows the commands with the values masked, and no rank (nor srun, which copies
the environment to every node) inherits the hub's token unless ``--env`` names it. Pure: files
written, no process started (the kernel tests in test_export.py / test_slurm.py run the same paths)."""
import io
import os
import stat

import pytest

from nbddp import DDPUsageError
from nbddp.core.ddpline import parse_line
from nbddp.core.envvars import HUB_TOKENS, rank_env
from nbddp.core.launch import Launch
from nbddp.core.torchrun_cli import node_commands
from nbddp.export import export_cell
from nbddp.sources.slurm import SlurmLaunch

SECRET = "s3cr3t-value"
HUB = {"JUPYTERHUB_API_TOKEN": "hub-token", "JPY_API_TOKEN": "old-hub-token", "HOME": "/home/u"}


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_ranks_and_srun_do_not_inherit_the_hub_token_unless_the_cell_names_it(tmp_path):
    env = rank_env(parse_line("-n 2"), 1, master_port=1, run_id="r", error_file="e", base_env=HUB)
    assert not set(HUB_TOKENS) & set(env) and env["HOME"] == "/home/u"
    asked = parse_line("-n 2 --env JUPYTERHUB_API_TOKEN=given")
    env = rank_env(asked, 0, master_port=1, run_id="r", error_file="e", base_env=HUB)
    assert env["JUPYTERHUB_API_TOKEN"] == "given" and "JPY_API_TOKEN" not in env
    launch = SlurmLaunch(Launch(parse_line("--launcher slurm -n 1"), source="pass", cwd=str(tmp_path),
                                env_base=dict(HUB, PATH="")))
    assert not set(HUB_TOKENS) & set(launch.base_env) and launch.base_env["HOME"] == "/home/u"


def test_exported_files_with_env_values_are_0600_and_the_notebook_sees_them_masked(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("old")
    script.chmod(0o644)  # an earlier export, readable by others: the new one is not
    out = io.StringIO()
    commands = export_cell(str(script), "print(1)\n", f"-n 2 --env TOKEN={SECRET} --env A=b --slurm", out=out)
    shown = out.getvalue()
    assert SECRET not in shown and "TOKEN=*** A=*** torchrun --nnodes=1" in shown, shown
    assert "only you can read" in shown
    assert commands == [f"TOKEN={SECRET} A=b torchrun --nnodes=1 --nproc-per-node=2 --standalone {script}"]
    sbatch = tmp_path / "train.sbatch"
    for path in (script, sbatch):
        assert mode(path) == 0o600, (path, oct(mode(path)))
        assert SECRET in path.read_text()  # the files still run as they are
    assert f"#   TOKEN={SECRET} A=b torchrun --nnodes=1" in script.read_text()
    job = sbatch.read_text()
    assert "unset JUPYTERHUB_API_TOKEN JPY_API_TOKEN\n" in job and f"export TOKEN={SECRET}\n" in job


def test_exported_files_without_env_values_keep_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        export_cell(str(tmp_path / "plain.py"), "print(1)\n", "-n 2 --slurm", out=io.StringIO())
    finally:
        os.umask(old)
    assert mode(tmp_path / "plain.py") == 0o644 and mode(tmp_path / "plain.sbatch") == 0o644


def test_the_export_writes_through_no_planted_link(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep")
    (tmp_path / "train.py").symlink_to(target)
    with pytest.raises(DDPUsageError, match=r"train\.py: it is a symbolic link"):
        export_cell(str(tmp_path / "train.py"), "print(1)\n", "-n 2", out=io.StringIO())
    assert target.read_text() == "keep"


def test_printed_commands_mask_every_env_value():
    spec = parse_line(f"--nnodes 2 -n 2 --master-port 29511 --env TOKEN={SECRET} --env 'B=x y'")
    for command in node_commands(spec, "t.py", masked=True):
        assert SECRET not in command and command.startswith("TOKEN=*** B=*** torchrun "), command
    assert node_commands(spec, "t.py")[0].startswith(f"TOKEN={SECRET} B='x y' torchrun ")
