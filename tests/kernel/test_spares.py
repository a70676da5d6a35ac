"""Spares (nbddp/forkserver/spares.py): processes forked after a cell for the next one. A cell served by
spares must be indistinguishable from one whose ranks were forked for it, and no spare may
outlive the kernel."""
import json
import os
import signal

from support.helpers import alive, wait_gone
from support.kernel import Kernel

DUMP = """%%ddp -n 3 -- --flag x
import os, sys, json, torch
print(json.dumps({"env": dict(os.environ), "argv": sys.argv[1:], "name": __name__, "cwd": os.getcwd(),
                  "threads": torch.get_num_threads(), "path0": sys.path[0]}))
"""


def spare_pids(kernel):
    kernel.settle()
    return json.loads(kernel.ok("import json, nbddp.forkserver.spares as s; print(json.dumps(s.pids()))").stdout)


def rank_pids(kernel):
    return json.loads(kernel.ok("import json; print(json.dumps([r.pid for r in _ddp.ranks]))").stdout)


def dumps(reply):
    found = (json.loads(line.split(":", 1)[1]) for line in reply.stdout.splitlines() if line.startswith("[rank"))
    return {d["env"]["RANK"]: d for d in found}


def comparable(dump):
    varying = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "NBDDP_SPARES"}
    return {**dump, "env": {k: v for k, v in dump["env"].items() if k not in varying}}


def test_a_cell_on_spares_sees_what_a_freshly_forked_cell_sees(fresh_kernel):
    k = fresh_kernel
    k.ok("%env NBDDP_SPARES=0")  # the kernel reads it per launch: this cell's ranks are forked for it
    forked = dumps(k.ok("%%ddp --output text" + DUMP[len("%%ddp"):]))
    k.ok("%env NBDDP_SPARES=8")
    k.ok("%%ddp -n 3\npass")  # leaves 3 spares behind
    waiting = spare_pids(k)
    assert len(waiting) == 3, waiting
    on_spares = dumps(k.ok("%%ddp --output text" + DUMP[len("%%ddp"):]))
    assert sorted(rank_pids(k)) == sorted(waiting), "the cell did not run on the spares"
    assert set(forked) == set(on_spares) == {"0", "1", "2"}
    for r in forked:
        assert comparable(on_spares[r]) == comparable(forked[r])
    assert on_spares["1"]["argv"] == ["--flag", "x"] and on_spares["1"]["threads"] == 1


def test_no_spare_outlives_the_kernel(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        k.ok("%load_ext nbddp")
        k.ok("%%ddp -n 4\npass")
        waiting = spare_pids(k)
        assert len(waiting) == 4 and not wait_gone(rank_pids(k), 5)
    finally:
        k.km.shutdown_kernel(now=True)  # SIGKILL: no atexit; the spares' job pipes close
    assert not wait_gone(waiting, 5), f"spares outlived the kernel: {alive(waiting)}"


def test_a_spare_killed_from_outside_is_replaced(kernel):
    kernel.ok("%%ddp -n 2\npass")
    waiting = spare_pids(kernel)
    os.kill(waiting[0], signal.SIGKILL)
    assert not wait_gone([waiting[0]], 5)
    reply = kernel.ok("%%ddp -n 2 --output text\nimport os\nprint('rank', os.environ['RANK'])")
    assert "[rank0]:rank 0" in reply.stdout and "[rank1]:rank 1" in reply.stdout, reply.text
    assert waiting[0] not in rank_pids(kernel)


def test_nbddp_spares_0_keeps_none(kernel):
    kernel.ok("%env NBDDP_SPARES=0")
    try:
        kernel.ok("import nbddp.forkserver.spares as s; s.clear()")
        kernel.ok("%%ddp -n 2\npass")
        assert spare_pids(kernel) == []
    finally:
        kernel.ok("%env NBDDP_SPARES=8")


SLOW_REFILL = """import threading, time
from nbddp.forkserver import spares, starter
spares.clear()
forked, start_all, forking = [], starter.start_all, threading.Event()
def slow_refill(processes, **kw):           # a loaded machine: the refill's forks take 7 s
    slow = threading.current_thread().name == "nbddp-spares" and not forked
    if slow:
        forking.set()
        time.sleep(7)
    start_all(processes, **kw)
    if slow:
        forked.extend(p.pid for p in processes)
starter.start_all = slow_refill
try:
    spares.refill(2)
    forking.wait(10)                        # the cell comes while the refill forks
    get_ipython().run_cell_magic("ddp", "-n 2 --output text --timeout 60", "pass")
finally:
    starter.start_all = start_all
print(json.dumps([sorted(forked), sorted(r.pid for r in _ddp.ranks)]))
"""


SLOW_OFFER = """import threading, time
from nbddp.forkserver import preload, spares, starter
spares.clear()
forked, start_all, offer = [], starter.start_all, preload.offer
def slow_offer(*args, **kw):                # the refill's first step, offering the notebook's modules: 3 s
    time.sleep(3)
    return offer(*args, **kw)
def recorded(processes, **kw):
    start_all(processes, **kw)
    if threading.current_thread().name == "nbddp-spares":
        forked.extend(p.pid for p in processes)
preload.offer, starter.start_all = slow_offer, recorded
try:
    spares.refill(2)                        # the cell comes while the refill offers, before it forks
    get_ipython().run_cell_magic("ddp", "-n 2 --output text --timeout 60", "pass")
finally:
    preload.offer, starter.start_all = offer, start_all
print(json.dumps([sorted(forked), sorted(r.pid for r in _ddp.ranks)]))
"""


def test_a_cell_that_comes_while_the_refill_offers_modules_waits_for_its_forks(fresh_kernel):
    """The refill offers the notebook's modules before it forks (its forks would wait behind
    that offer in the forkserver anyway): a cell that came then took no spare and forked its
    own ranks, and the refill's forks followed beside them ("Too many open files" in the
    300-cell test at four test files at a time)."""
    reply = fresh_kernel.ok("import json\n" + SLOW_OFFER, timeout=120)
    forked, ranks = json.loads(reply.stdout.strip().splitlines()[-1])
    assert len(forked) == 2 and forked == ranks, f"the cell forked its own ranks beside the refill: {reply.text}"


def test_a_cell_waits_for_a_slow_refill_instead_of_forking_beside_it(fresh_kernel):
    """A refill still forking when the next cell comes is making that cell's ranks: the cell
    takes them once they are ready, however slow the machine, instead of forking a second set
    beside them (twice the kernel's descriptors at once: 300 `-n 8` cells under a
    256-descriptor limit hit "Too many open files" in a CI run, where a fixed 5 s wait ran out)."""
    fresh_kernel.ok("%env NBDDP_PRELOAD=0")  # no module offer before the refill forks
    fresh_kernel.ok("%%ddp -n 2\npass")
    reply = fresh_kernel.ok("import json\n" + SLOW_REFILL, timeout=120)
    forked, ranks = json.loads(reply.stdout.strip().splitlines()[-1])
    assert len(forked) == 2 and forked == ranks, f"the cell forked its own ranks beside the refill: {reply.text}"
