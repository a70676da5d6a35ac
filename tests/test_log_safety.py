"""A --log-dir another user can reach (issue #37 point 3), for real: a folder another user owns
or can write is refused in one line before anything starts; links planted in the user's own
folder are replaced, never written through; and a status file naming a pid nbddp did not start
(planted, or left by an earlier launch) never makes the kernel signal that process."""
import os
import subprocess
import time

import pytest

from nbddp.core.errors import DDPUsageError
from nbddp.kernel import logdirs

ROOT = os.geteuid() == 0


def _nobody_uid():
    import pwd

    return pwd.getpwnam("nobody").pw_uid


# ------------------------------------------------------------------ pure: the folder and the files
def test_a_folder_another_user_can_write_or_owns_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o770)
    a_file = tmp_path / "file"
    a_file.write_text("")
    for path, said in [(open_dir, "can be written by other users"), (group, "can be written by other users"),
                       (a_file, "is not a folder")]:
        with pytest.raises(DDPUsageError, match=said):
            logdirs.new_log_dir(str(path))
    if ROOT:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, _nobody_uid(), -1)
        with pytest.raises(DDPUsageError, match="belongs to another user"):
            logdirs.new_log_dir(str(theirs))
    mine = tmp_path / "new" / "logs"
    assert logdirs.new_log_dir(str(mine)) == str(mine)  # made, 0700
    assert os.stat(mine).st_mode & 0o077 == 0


def test_planted_links_are_replaced_not_written_through(tmp_path):
    victim = tmp_path / "bashrc"
    victim.write_text("the user's own file\n")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "rank0.stdout").symlink_to(victim)
    os.link(victim, logs / "rank0.stderr")  # a hard link too
    for name, mode in [("rank0.stdout", "wb"), ("rank0.stderr", "wb")]:
        with open(logs / name, mode, opener=logdirs.private) as f:
            f.write(b"rank output\n")
    assert victim.read_text() == "the user's own file\n"
    assert not (logs / "rank0.stdout").is_symlink() and (logs / "rank0.stdout").read_bytes() == b"rank output\n"
    (logs / "agent.log").symlink_to(victim)
    with pytest.raises(OSError):  # appending never follows a link either
        open(logs / "agent.log", "a", opener=logdirs.private)
    assert victim.read_text() == "the user's own file\n"


# ------------------------------------------------------------------- in a kernel, end to end
@pytest.mark.kernel
def test_a_log_dir_in_reach_of_others_in_a_kernel(kernel, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    reply = kernel.execute(f"%%ddp -n 1 --log-dir {open_dir}\nprint('ran')")
    assert reply.status == "error" and "UsageError: --log-dir " in reply.stderr, reply.text  # one line
    assert "can be written by other users" in reply.stderr and "ran" not in reply.stdout
    assert os.listdir(open_dir) == []
    victim = tmp_path / "bashrc"
    victim.write_text("the user's own file\n")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    for name in ("rank0.stdout", "rank0.stderr", "cell.py"):
        (mine / name).symlink_to(victim)
    kernel.ok(f"%%ddp -n 1 --log-dir {mine}\nprint('ran')")
    assert victim.read_text() == "the user's own file\n"
    assert (mine / "rank0.stdout").read_text() == "ran\n" and not (mine / "rank0.stdout").is_symlink()


PLANT = """import json, os, socket, time
status = {status!r}
json.dump({{"rank": 1, "local_rank": 1, "node_rank": 0, "pid": {pid}, "host": socket.gethostname(),
           "restart": 0, "started_at": time.time()}}, open(status + "/rank1.json.tmp", "w"))
os.replace(status + "/rank1.json.tmp", status + "/rank1.json")
time.sleep(1.5)   # the kernel reads it
raise SystemExit(3)
"""


@pytest.mark.kernel
def test_a_status_file_naming_a_pid_nbddp_did_not_start_is_not_signalled(kernel, tmp_path):
    """A rank (standing in for whoever could write the status folder) leaves rank1.json naming
    a process of the user's that nbddp did not start, and fails: the kernel stops the launch and
    SIGKILLs the groups of the ranks still running by their status files — never that one."""
    victim = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        logs = tmp_path / "tr"
        cell = PLANT.format(status=str(logs / "status"), pid=victim.pid)
        reply = kernel.execute(f"%%ddp -n 1 --launcher torchrun --log-dir {logs}\n{cell}", timeout=120)
        assert reply.error, reply.text
        time.sleep(0.5)
        assert victim.poll() is None, f"the kernel signalled a process it did not start: {victim.returncode}"
    finally:
        victim.kill()
        victim.wait()
