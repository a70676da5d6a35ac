"""What the test files of every layer share: the repository's root, a real kernel driven over
ZMQ (support/kernel.py), free ports and deadline waits (support/helpers.py), JupyterLab's
rendering of a stream (support/frontend.py), and the tables both layers read of the lessons
(support/lessons.py), the README (support/readme.py) and the fuzzer (support/fuzz.py).
tests/conftest.py (and the benchmarks that drive a kernel) put tests/ on the path."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
