"""Rank logs are bounded and never end a job (issue #37 point 10): a runaway print loop keeps
the head of its log, one line saying what was cut, and the last 64 KB (what the diagnosis
reads); a full disk (ENOSPC on a real, tiny tmpfs) leaves the ranks running, their output
shown, and says so once, in one line. (The caps on files alone: tests/unit/test_log_caps.py.)"""
import os
import subprocess

import pytest

from nbddp.core import settings
from nbddp.sources import ranklogs

LOUD = """import sys
for i in range(40000):
    print(f"line {i:06d} " + "x" * 40)
print("the end", flush=True)
print("RuntimeError: the last words", file=sys.stderr)
"""


@pytest.mark.parametrize("launcher", ["", "--launcher torchrun"])
def test_a_runaway_log_keeps_its_head_a_cut_line_and_its_tail(kernel, tmp_path, launcher):
    logs = tmp_path / "logs"
    kernel.ok(f"import os; os.environ['{settings.LOG_RANK_MB.name}'] = '0.25'")
    try:
        reply = kernel.execute(f"%%ddp -n 2 --log-dir {logs} --output text {launcher}\n" + LOUD, timeout=180)
    finally:
        kernel.ok(f"del os.environ['{settings.LOG_RANK_MB.name}']")
    assert reply.status == "ok", reply.text[-2000:]
    out = (logs / "rank0.stdout").read_bytes()
    assert len(out) <= (1 << 18) + ranklogs.TAIL + 200, len(out)
    assert out.startswith(b"line 000000 ") and out.endswith(b"the end\n")
    assert out.count(b"[nbddp: ") == 1 and b"NBDDP_LOG_RANK_MB=0.25 MB a log" in out
    assert (logs / "rank1.stderr").read_text() == "RuntimeError: the last words\n"
    assert reply.text.count("log reached its cap") == 1, reply.text[-3000:]
    copies = list(logs.rglob("stdout.log"))  # torchrun's own (--tee): cut once it has ended
    assert bool(copies) == bool(launcher) and all(p.stat().st_size <= (1 << 18) + 200 for p in copies), \
        [(p, p.stat().st_size) for p in copies]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tiny tmpfs (needs root)")
def test_a_full_disk_leaves_the_ranks_running_and_says_so_once(kernel, tmp_path):
    full = tmp_path / "full"
    full.mkdir(mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(full)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        cell = LOUD + "import time; time.sleep(0.5); print('after the disk filled')\n"
        # --same-lines apart: the two ranks' equal lines are not said once as [ranks 0–1]:
        reply = kernel.execute(f"%%ddp -n 2 --log-dir {full} --output text --same-lines apart\n{cell}",
                               timeout=180)
        assert reply.status == "ok", reply.text[-3000:]
        assert reply.text.count("[rank0]:after the disk filled") == 1, reply.text[-3000:]
        assert reply.text.count("[rank1]:after the disk filled") == 1, reply.text[-3000:]
        said = " ".join(reply.text.split())  # the note is wrapped between words (a long folder name)
        assert said.count("could not write") == 1 and "No space left on device" in said, reply.text[-3000:]
        assert "Traceback" not in reply.text
        assert kernel.ok("print(_ddp.ok)").stdout.strip() == "True"
    finally:
        subprocess.run(["umount", "-l", str(full)])
