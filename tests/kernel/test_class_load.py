"""A class on one server, small: 3 kernels run the same lesson at the same moment (the full
version, 8 kernels × lessons 00-05, is benchmarks/class_load.py). Every kernel's lesson passes
its own checks, each kernel's ranks are in a private network of their own where the machine
allows one, and nothing of any kernel is left afterwards."""
import importlib.util
import os
import time

import support
from nbddp.forkserver import privnet

ROOT = str(support.ROOT)
spec = importlib.util.spec_from_file_location("class_load", os.path.join(ROOT, "benchmarks", "class_load.py"))
class_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(class_load)


def test_three_kernels_run_one_lesson_at_once(tmp_path):
    private = not privnet.unavailable()
    started = time.monotonic()
    # with the notebook-module offers on (the default): before they left the SIGUSR2 handler,
    # one arriving while the forkserver forked deadlocked it (3 of 3 two-student runs here)
    result = class_load.run(3, ["01"], private=private, solo=False, out_root=str(tmp_path), deadline_s=240)
    elapsed = time.monotonic() - started
    print(class_load.table(result, 3), f"\n{elapsed:.0f} s in all, private network: {private}")
    assert not result["failures"], result["failures"]
    assert not result["left"], result["left"]
    assert len(result["load"]["01_world_size_and_ranks.ipynb"]) == 3


def test_only_push_folders_of_other_running_kernels_are_not_the_runs(tmp_path):
    import subprocess

    alive = tmp_path / f"nbddp-push-{os.getpid()}-abc"   # this process runs and is not the run's
    assert class_load.someone_elses(str(alive), ours=set())
    assert not class_load.someone_elses(str(alive), ours={os.getpid()})
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not class_load.someone_elses(str(tmp_path / f"nbddp-push-{gone.pid}-abc"), ours=set())  # left: a leak
    assert not class_load.someone_elses(str(tmp_path / "nbddp-push-abc"), ours=set())  # no pid in it: counted
