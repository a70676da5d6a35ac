"""A --log-dir another user can reach (issue #37 point 3), in a real kernel: such a folder is refused
in one line before anything starts; a status file naming a pid nbddp did not start (planted, or
left by an earlier launch) never makes the kernel signal that process; and, acting as ``nobody``
(root only), a --log-dir the user cannot write is refused in one line. (The folder checks and the
planted links, without a kernel: tests/unit/test_log_dir_checks.py.)"""
import os
import shutil
import subprocess
import time

import pytest

from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError

ROOT = os.geteuid() == 0


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


@pytest.mark.skipif(not ROOT, reason="needs root (to act as a second user, nobody)")
def test_a_log_dir_the_user_cannot_write_is_refused_before_anything_starts():
    """As ``nobody``: a --log-dir in root's 0755 folder is refused in one line (it was an OSError
    from inside the launch)."""
    import pwd
    import tempfile

    root = tempfile.mkdtemp(prefix="nbddp-test-logdir-")
    os.chmod(root, 0o755)
    # the rules' lazy imports (encodings.ascii, for /proc/meminfo) done as root first: nobody cannot
    # read root's own Python here (a pyenv in /root), and an import in the child failed for that alone
    parse_line(f"--log-dir {root}")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, the rule, the message back
        try:
            os.setgid(pwd.getpwnam("nobody").pw_gid)
            os.setuid(pwd.getpwnam("nobody").pw_uid)
            out = []
            for d in (root, os.path.join(root, "new", "logs")):
                try:
                    parse_line(f"--log-dir {d}")
                    out.append(f"accepted {d}")
                except DDPUsageError as exc:
                    out.append(str(exc))
                except BaseException as exc:  # said, so the test fails naming it, not with []
                    out.append(f"raised {exc!r}")
            os.write(write, "\n".join(out).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read) as f:
            said = f.read().splitlines()
        os.waitpid(pid, 0)
    finally:
        shutil.rmtree(root)
    assert said == [
        f"%%ddp: --log-dir {root} is not writable by this user",
        f"%%ddp: --log-dir {root}/new/logs cannot be made: {root} is not writable by this user",
    ], said
