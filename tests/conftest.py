"""The layers are folders: tests/unit/ is pure and takes seconds (``pytest -m "not kernel"``);
tests/kernel/ starts processes (a Jupyter kernel, ranks, torchrun, a Slurm job, pip, a docs
build) and tests/browser/ drives Chromium with playwright besides, and together they take minutes.
The folder gives the marker (``kernel``; ``browser`` too in tests/browser/), so a file's place
is its layer. A test in tests/unit/ that starts a process fails, saying so, so nothing slow slips
into the fast layer; one marked ``kernel`` or using a kernel fixture there is refused before any
test runs. What the folders share is in tests/support/."""
import os
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from support.kernel import Kernel

# Many cells here count each rank's own copy of a line ("next cell ok" twice), so the suite's
# kernels show identical lines apart; the default, merge, is tested where it is said
# (tests/kernel/test_same_lines.py, tests/unit/test_same_lines_rules.py, tests/unit/test_text_view.py).
os.environ.setdefault("NBDDP_SAME_LINES", "apart")

KERNEL_FIXTURES = {"kernel", "fresh_kernel"}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One real kernel per test module, with nbddp loaded."""
    k = Kernel(cwd=str(tmp_path_factory.mktemp("nb"))).load_nbddp()
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel(tmp_path):
    """A kernel of the test's own, for tests that interrupt or kill it."""
    k = Kernel(cwd=str(tmp_path)).load_nbddp()
    yield k
    k.shutdown()


# Seconds each of the longest files (of tests/kernel/ and tests/browser/, by name) took in a
# whole-suite run (2 cores, 2026-12-06, three files at a time). scripts/test.sh hands files out in
# collection order (--no-loadscope-reorder: xdist would otherwise order them by their number of
# tests): longest first, so no long file starts last and leaves the other workers idle while it ends.
LONGEST = {"test_notebooks.py": 510, "test_browser.py": 272, "test_ray_launcher.py": 232, "test_readme.py": 179,
           "test_faults.py": 113, "test_elastic.py": 106, "test_descriptors.py": 104, "test_slurm.py": 98,
           "test_interrupts.py": 86, "test_kernel_death.py": 75, "test_wheel.py": 73, "test_private_net.py": 70,
           "test_preload.py": 66, "test_training_soak.py": 61, "test_spares.py": 54, "test_cell_script.py": 46,
           "test_class_load.py": 42, "test_torchrun_attribution.py": 38, "test_diagnosis.py": 34,
           "test_docs.py": 60, "test_colab_pins.py": 150}  # their venv and site are built on a fresh clone


TESTS = Path(__file__).resolve().parent
LAYERS = {"unit": (), "kernel": ("kernel",), "browser": ("kernel", "browser")}  # folder: its markers


def layer(item) -> str:
    """The layer folder a test item's file is in (tests/<layer>/...)."""
    path = Path(item.path).resolve()
    folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else None
    if folder not in LAYERS:
        raise pytest.UsageError(f"{path} is in no layer's folder: put it in tests/unit/ (pure), tests/kernel/ "
                                "(starts processes) or tests/browser/ (drives a browser)")
    return folder


def pytest_collection_modifyitems(items):
    for item in items:
        folder = layer(item)
        if folder == "unit" and (item.get_closest_marker("kernel")
                                 or KERNEL_FIXTURES & set(getattr(item, "fixturenames", ()))):
            raise pytest.UsageError(f"{item.nodeid} starts processes (marked `kernel` or uses a kernel fixture) "
                                    "but is in tests/unit/: move it to tests/kernel/")
        for name in LAYERS[folder]:
            item.add_marker(name)
    items.sort(key=lambda item: -_seconds_alone(item))  # stable: a file's tests keep their order


def _seconds_alone(item) -> int:
    return LONGEST.get(Path(item.path).name, 0)


# ----------------------------------------------------------- the fast layer starts no process
# Every way this process can start another passes an audit event (sys.audit): subprocess
# (which a kernel, torchrun, the browser and nbddp's forkserver use), os.fork, posix_spawn,
# os.system, exec. nbddp's ranks come from a forkserver (or its spares) that may already run (an
# earlier test in this process started it), so nbddp's launch of ranks is refused as well. Only
# the test's own thread and the ones it starts count: a background thread of an earlier test
# (nbddp refilling its spares) is not this test's doing.
STARTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec"}
# The one exception: a test marked ``starts_tool(NAME)`` may start that tool's own executable, and
# nothing else (no shell, no other program, no ranks): a quick checker with no in-process API
# (ruff: tests/unit/test_lint.py). The events that name the executable are matched on its real path.


def _ruff() -> str:
    from ruff.__main__ import find_ruff_bin

    return find_ruff_bin()


TOOLS = {"ruff": _ruff}  # name -> its executable (a name not here allows nothing)
_TOOL_EVENTS = {"subprocess.Popen", "os.posix_spawn"}  # (executable, argv, ...): what is started
_tools: set[str] = set()  # the real paths the running test may start
RANK_STARTS = [("nbddp.sources.rankprocs", "RankProcs", "start"),  # fresh ranks and spares
               ("nbddp.forkserver.starter", None, "start"), ("nbddp.forkserver.starter", None, "start_all")]
_fast_test: list = []  # the nodeid of the unmarked test running now, if one runs
_outside: set[int] = set()  # threads that were running before it began


def _refuse(what: str) -> None:
    if _fast_test and threading.get_ident() not in _outside:
        raise RuntimeError(f"{_fast_test[0]} starts a process ({what}) but is not marked `kernel`: "
                           "move it to tests/kernel/")


def _audit(event: str, args) -> None:
    if event in STARTS and not (event in _TOOL_EVENTS and _tools and _real_path(args[0]) in _tools):
        _refuse(event)


def _real_path(executable) -> str:
    try:
        return os.path.realpath(os.fsdecode(executable))
    except (TypeError, ValueError):
        return ""


sys.addaudithook(_audit)


def _refusing(original):
    def start(*args, **kwargs):
        _refuse("nbddp ranks")
        return original(*args, **kwargs)
    return start


def _rank_starters():
    """(owner, name) of nbddp's rank starts already imported (one not imported yet cannot have
    started a forkserver: its start will pass the audit hook)."""
    for module, owner, name in RANK_STARTS:
        if module in sys.modules:
            yield (getattr(sys.modules[module], owner) if owner else sys.modules[module]), name


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    fast = item.get_closest_marker("kernel") is None
    saved = [(owner, name, getattr(owner, name)) for owner, name in _rank_starters()] if fast else []
    for owner, name, original in saved:
        setattr(owner, name, _refusing(original))
    if fast:
        _outside.update(t.ident for t in threading.enumerate() if t is not threading.main_thread())
        _fast_test[:] = [item.nodeid]
        allowed = item.get_closest_marker("starts_tool")
        _tools.update(_real_path(TOOLS[name]()) for name in (allowed.args if allowed else ()) if name in TOOLS)
    try:
        yield
    finally:
        _fast_test.clear()
        _outside.clear()
        _tools.clear()
        for owner, name, original in saved:
            setattr(owner, name, original)
