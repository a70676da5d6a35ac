"""Rank logs are bounded (issue #37 point 10), on real files without a process: past a launch's
cap every log keeps its head, one line saying what was cut, and its tail, and a cut log reads
whole on disk after each flush. (A runaway rank and a full disk in a real kernel:
tests/kernel/test_log_limits.py.)"""
import os

from nbddp.core import settings
from nbddp.sources import ranklogs


def test_a_launch_cap_cuts_every_log_past_it(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.LOG_RANK_MB.name, "1")
    monkeypatch.setenv(settings.LOG_TOTAL_MB.name, "0.5")
    said = []
    budget = ranklogs.LogBudget(said.append)
    logs = [ranklogs.RankLog(str(tmp_path / f"rank{r}.stdout"), budget, f"rank {r}") for r in range(2)]
    for _ in range(100):
        for log in logs:
            log.write(b"y" * 4000)
    for log in logs:
        log.write(b"\nlast line\n")
        log.close()
    sizes = [os.path.getsize(tmp_path / f"rank{r}.stdout") for r in range(2)]
    assert sum(sizes) <= (1 << 19) + 2 * (ranklogs.TAIL + 200), sizes
    for r in range(2):
        text = (tmp_path / f"rank{r}.stdout").read_bytes()
        assert text.endswith(b"last line\n") and b"[nbddp: " in text and b"NBDDP_LOG_TOTAL_MB=0.5" in text
    assert len(said) == 1 and "NBDDP_LOG_TOTAL_MB=0.5 MB" in said[0], said


def test_a_cut_log_reads_whole_on_disk_after_each_flush(tmp_path, monkeypatch):
    """A pool flushes its cell's logs when the cell ends (the log stays open for no one): the
    file then already ends with the cut line and the tail, rewritten after the head each time."""
    monkeypatch.setenv(settings.LOG_RANK_MB.name, str(100_000 / 2**20))
    log = ranklogs.RankLog(str(tmp_path / "rank0.stderr"), ranklogs.LogBudget(lambda text: None), "rank 0")
    for i in range(3):
        for j in range(2000):
            log.write(f"{i} {j:05d} ".encode() + b"z" * 90 + b"\n")
        log.flush()
        text = (tmp_path / "rank0.stderr").read_bytes()
        assert text.count(b"[nbddp: ") == 1 and text.endswith(f"{i} 01999 ".encode() + b"z" * 90 + b"\n")
        assert len(text) <= 100_000 + ranklogs.TAIL + 200
    log.close()
    assert (tmp_path / "rank0.stderr").read_bytes() == text
