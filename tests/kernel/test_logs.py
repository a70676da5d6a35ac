"""Log folders in a real kernel: the kernel's default folder keeps the last launches only and
goes with the kernel (even one that is killed); a --log-dir folder is never deleted; files are
0600 in 0700 folders."""
import os
import stat

from support.helpers import wait_until
from support.kernel import Kernel


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _value(kernel, expr):
    return eval(kernel.ok(f"print(repr({expr}))").stdout)


def test_default_logs_are_bounded_private_and_go_with_the_kernel(tmp_path):
    mine = tmp_path / "mine"
    k = Kernel(cwd=str(tmp_path))
    try:
        k.ok("%load_ext nbddp")
        assert _value(k, "__import__('nbddp.kernel.logdirs').kernel.logdirs.KEEP") == 50
        k.ok("import nbddp.kernel.logdirs; nbddp.kernel.logdirs.KEEP = 3; payload = 1")  # the same rule, fewer cells
        k.ok(f"%%ddp -n 2 --log-dir {mine} --push payload\npass")
        for _ in range(5):
            k.ok("%%ddp -n 2\nprint('hello')")
        last = _value(k, "_ddp.log_dir")
        root = os.path.dirname(last)
        assert sorted(os.listdir(root)) == ["launch-3", "launch-4", "launch-5"], os.listdir(root)
        assert _mode(root) == 0o700 and _mode(last) == 0o700
        files = os.listdir(last)
        assert {"cell.py", "rank0.stdout", "rank1.stderr", "rank0.stacks"} <= set(files), files
        assert all(_mode(os.path.join(last, f)) == 0o600 for f in files), \
            {f: oct(_mode(os.path.join(last, f))) for f in files}
        # a pool's folder is kept while the pool runs; its cells age like launches
        k.ok("%ddp_pool start -n 2")
        for _ in range(5):
            k.ok("%%ddp\nprint('cell')")
        pool_dir = os.path.dirname(_value(k, "_ddp.log_dir"))
        for _ in range(4):
            k.ok("%%ddp --fresh -n 1\npass")
        assert os.path.basename(pool_dir) == "launch-6"  # older than every other launch kept:
        assert set(os.listdir(root)) == {"launch-6", "launch-8", "launch-9", "launch-10"}, os.listdir(root)
        assert sorted(d for d in os.listdir(pool_dir) if d.startswith("cell-")) == ["cell-3", "cell-4", "cell-5"]
        k.ok("%ddp_pool stop")
        push_dir = _value(k, "nbddp.kernel.pushing._folder")
        assert os.path.isdir(push_dir)
    finally:
        k.shutdown()  # SIGKILL: no atexit in the kernel
    assert wait_until(lambda: not os.path.exists(root) and not os.path.exists(push_dir), 10)
    assert (mine / "rank0.stdout").exists() and (mine / "cell.py").exists()  # the user's: kept


def test_a_long_tmpdir_still_runs_cells(tmp_path):
    """A TMPDIR so long that multiprocess's socket in it would pass a Unix socket's 107 bytes
    (a cluster job's scratch folder; pytest-xdist's folders): the cell runs, and the socket's
    folder made elsewhere goes with the kernel."""
    deep = tmp_path / ("scratch-" + "x" * 40) / ("job-" + "y" * 40)
    deep.mkdir(parents=True)
    assert len(str(deep)) + len("/pymp-12345678/listener-12345678") > 107
    k = Kernel(cwd=str(tmp_path), env=dict(os.environ, TMPDIR=str(deep)))
    try:
        k.ok("%load_ext nbddp")
        reply = k.ok("%%ddp -n 2\nprint('ran')", timeout=180)
        assert "[rank0]:ran" in reply.stdout and "[rank1]:ran" in reply.stdout, reply.text
        folder = k.ok("import multiprocess.util as u; print(u.get_temp_dir())").stdout.strip()
        assert len(folder) < 60 and os.path.isdir(folder), folder
    finally:
        k.shutdown()
    assert wait_until(lambda: not os.path.exists(folder), 15), f"{folder} left after the kernel ended"
