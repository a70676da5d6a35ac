"""A --log-dir another user can reach (issue #37 point 3), on real folders and files without a
process: a folder another user owns or can write is refused in one line before anything starts;
links planted in the user's own folder are replaced, never written through. (In a real kernel,
and a pid planted in a status file: tests/kernel/test_log_safety.py.)"""
import os

import pytest

from nbddp.core.errors import DDPUsageError
from nbddp.kernel import logdirs

ROOT = os.geteuid() == 0


def _nobody_uid():
    import pwd

    return pwd.getpwnam("nobody").pw_uid


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
