"""The slow layer by its folder: a test in tests/kernel/ is marked ``kernel`` without saying so and
may start a process. (The fast layer's refusals: tests/unit/test_fast_layer.py.)"""
import subprocess
import sys
from pathlib import Path


def test_a_test_in_tests_kernel_is_marked_and_may_start_a_process(request):
    assert Path(request.node.path).parent.name == "kernel"
    assert request.node.get_closest_marker("kernel") is not None
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
