"""The stop button, for real: Jupyter's interrupt (SIGINT to the kernel's whole process group)
at random moments of fresh and pool cells, right after %load_ext, during the cell's own
handlers, on ranks that ignore signals, twice; and how ranks that exit by themselves are
reported. Every case checks that the cell ends with one line, nothing of nbddp's leaks
out, no rank survives (by pid) and the next cell works."""
import json
import os
import random
import re
import signal
import time

import pytest

from support.helpers import alive, wait_gone
from support.kernel import Kernel

STRESS = int(os.environ.get("NBDDP_STRESS", "50"))  # interrupts per kind (fresh, pool): 100 in all
BUSY = "while True:\n    pass\n"
NEXT = "%%ddp -n 2\nprint('next ok')"
INTERNAL = re.compile(r"nbddp/\w+\.py|KeyError|ValueError|EOFError|is not registered|Fatal Python")


def interrupt_at(k: Kernel, code: str, offset: float, timeout: float = 30):
    """Execute ``code``, interrupt it ``offset`` s later; again every 5 s if the first one
    came before the kernel began the cell (ipykernel ignores SIGINT while idle)."""
    msg_id = k.kc.execute(code)
    time.sleep(offset)
    k.km.interrupt_kernel()
    sent = [time.monotonic()]
    deadline = time.monotonic() + timeout
    while True:
        try:
            return k.collect(msg_id, timeout=5), len(sent)
        except TimeoutError as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{exc}\n{len(sent)} interrupts sent; the kernel's stacks:\n{k.stacks()}") from None
            k.km.interrupt_kernel()
            sent.append(time.monotonic())


def one_line_interrupt(reply) -> str:
    assert reply.error, f"the cell raised nothing: {reply.text[-1500:]}"
    assert reply.error["ename"] == "KeyboardInterrupt", reply.error
    tb = reply.error["traceback"]
    assert len(tb) == 1 and "\n" not in tb[0].strip(), "\n".join(tb)
    ours = [line for line in reply.text.splitlines() if not line.startswith("[rank")]
    assert not INTERNAL.search("\n".join(ours + tb)), reply.text[-3000:]
    return tb[0]


def interrupt_when(k: Kernel, code: str, *conditions):
    """Execute ``code``; interrupt once each of ``conditions`` (on the reply so far) holds, in
    order. Returns the reply and the times the interrupts were sent."""
    msg_id = k.kc.execute(code)
    sent = []

    def on_output(reply):
        if len(sent) < len(conditions) and conditions[len(sent)](reply):
            sent.append(time.monotonic())
            k.km.interrupt_kernel()

    reply = k.collect(msg_id, timeout=60, on_output=on_output)
    assert len(sent) == len(conditions), reply.text
    return reply, sent


def info(k: Kernel):
    return json.loads(k.ok("import json, nbddp.sources.supervisor as _s; print(json.dumps("
                           "[[r.pid for r in _ddp.ranks], [type(x).__name__ for x in _s.live()]]))").stdout)


def test_100_interrupts_at_random_moments_on_fresh_and_pool_cells(tmp_path):
    """Each: one line, nothing of nbddp's, the next cell works, no launch left registered;
    3 s after the last, no rank of any interrupted cell is alive."""
    k = Kernel(cwd=str(tmp_path))
    rng = random.Random(12)
    try:
        k.arm_stack_dump(str(tmp_path / "kernel-stacks.txt"))
        k.ok("%load_ext nbddp")
        k.ok(NEXT, timeout=120)  # the forkserver is up
        seen, repeats = [], 0
        t0 = time.monotonic()
        for kind, cell, check in (("fresh", "%%ddp -n 2\n" + BUSY, NEXT),
                                  ("pool", "%%ddp\n" + BUSY, "%%ddp\nprint('next ok')")):
            if kind == "pool":
                k.ok("%ddp_pool start -n 2", timeout=120)
            for i in range(STRESS):
                reply, sent = interrupt_at(k, cell, rng.uniform(0, 0.2))
                repeats += sent - 1
                one_line_interrupt(reply)
                pids, live = info(k)
                assert live == ([] if kind == "fresh" else ["PoolRanks"]), f"{kind} cell {i}: registry {live}"
                seen += pids
                reply = k.ok(check)
                assert reply.stdout.count("next ok") == 2, reply.text
            if kind == "pool":
                status = k.ok("%ddp_pool status").stdout
                assert "ready" in status and status.count(", alive") == 2, status
                k.ok("%ddp_pool stop")
        elapsed = time.monotonic() - t0
        print(f"{2 * STRESS} interrupts in {elapsed:.1f} s ({repeats} sent again: came before the cell began)")
        time.sleep(3)
        assert not alive(set(seen)), f"ranks alive 3 s after their cell: {alive(set(seen))}"
        assert info(k)[1] == []
    finally:
        k.shutdown()


def test_interrupt_right_after_load_ext_then_a_4_rank_cell(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        k.ok("%load_ext nbddp")  # returns at once; the forkserver starts and imports torch now
        time.sleep(0.2)
        k.km.interrupt_kernel()  # SIGINT to the kernel's process group, as Jupyter sends it
        time.sleep(0.8)
        k.km.interrupt_kernel()
        reply = k.ok("%%ddp -n 4\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
                     "t = __import__('torch').ones(1); dist.all_reduce(t); print('sum', t.item())", timeout=180)
        assert reply.stdout.count("sum 4.0") == 4, reply.text
        assert "forkserver had ended" not in reply.text and "Traceback" not in reply.text, reply.text
    finally:
        k.shutdown()


def test_forkserver_in_its_own_session_and_replaced_if_it_dies(kernel):
    kernel.ok(NEXT, timeout=120)
    server = kernel.forkserver()
    assert server is not None
    assert os.getsid(server.pid) == server.pid != os.getsid(kernel.pid)  # the stop button cannot reach it
    os.kill(server.pid, signal.SIGKILL)
    # the next cell meets a dead one, not a dying one (tests/kernel/test_faults.py)
    assert not wait_gone([server.pid], 60), "the killed forkserver did not exit"
    reply = kernel.ok(NEXT, timeout=180)
    assert reply.stdout.count("next ok") == 2, reply.text
    notes = [line for line in reply.text.splitlines() if "forkserver had ended" in line]
    assert len(notes) == 1 and f"pid {server.pid}" in notes[0], reply.text
    assert "forkserver had ended" not in kernel.ok(NEXT).text


def test_a_start_after_the_warm_forkserver_died_gets_a_new_ones_limit():
    """A limit taken before the start that replaces a dead forkserver (the spares' refill, a
    launch) is a new forkserver's, which imports torch first: it was the warm one's 10 s, and on
    a loaded machine the replacement was killed as stuck (CI: no forkserver after the refill)."""
    from multiprocess import forkserver

    from nbddp.forkserver import starter

    child = os.fork()
    if child == 0:
        os._exit(0)
    held = starter._answered, forkserver._forkserver._forkserver_pid
    try:
        starter._answered = forkserver._forkserver._forkserver_pid = child
        time.sleep(0.2)
        assert starter.answer_limit() == starter.FIRST_ANSWER_S
    finally:
        starter._answered, forkserver._forkserver._forkserver_pid = held
        os.waitpid(child, 0)


def test_forkserver_replaced_between_cells_by_the_spares_refill_is_still_reported(kernel):
    kernel.ok(NEXT, timeout=120)
    # the refill that cell started ends first: one still forking when the forkserver is killed
    # (a loaded machine) outlives clear()'s wait, so refill() below would be a no-op beside it
    kernel.ok("from nbddp.forkserver import spares\nspares.settle(120)", timeout=180)
    server = kernel.forkserver()
    os.kill(server.pid, signal.SIGKILL)
    # the next cell meets a dead one, not a dying one (tests/kernel/test_faults.py)
    assert not wait_gone([server.pid], 60), "the killed forkserver did not exit"
    # the background refill of spares forks first: multiprocess starts a new forkserver for it
    kernel.ok("from nbddp.forkserver import spares\nspares.clear(); spares.refill(2); spares.settle(120)", timeout=180)
    replacement = kernel.forkserver()
    assert replacement is not None and replacement.pid != server.pid
    reply = kernel.ok(NEXT, timeout=180)
    notes = [line for line in reply.text.splitlines() if "forkserver had ended" in line]
    assert len(notes) == 1 and f"pid {server.pid}" in notes[0] and "background" in notes[0], reply.text


def test_forkserver_killed_mid_cell_leaves_the_ranks_own_exit_codes(kernel):
    """The forkserver reports each rank's exit code; killed while the ranks run, it reports
    none. That is no exit: the ranks run on, and each is reported with the code it exited with
    (never multiprocess's 255 for "status pipe closed"); the next cell gets a new forkserver."""
    kernel.ok(NEXT, timeout=120)
    server = kernel.forkserver()

    def kill_when_both_sleep(reply):
        if reply.stdout.count("sleeping") == 2 and alive([server.pid]):
            os.kill(server.pid, signal.SIGKILL)

    msg_id = kernel.kc.execute("%%ddp -n 2 --output text\nimport os, sys, time\nprint('sleeping', flush=True)\n"
                               "time.sleep(3)\nprint('woke', flush=True)\n"
                               "sys.exit(3 if os.environ['RANK'] == '1' else 0)")
    reply = kernel.collect(msg_id, timeout=60, on_output=kill_when_both_sleep)
    assert not alive([server.pid]), "the forkserver was not killed mid-cell"
    assert reply.stdout.count("woke") == 2, reply.text
    codes = kernel.ok("import json; print(json.dumps([(r.exitcode, r.state) for r in _ddp.ranks]))").stdout
    assert json.loads(codes) == [[0, "ok"], [3, "failed"]], codes
    assert reply.error and "rank 1: failed (exited with code 3)" in "\n".join(reply.error["traceback"]), reply.text
    # a forkserver's death must not show as the ranks' exit code (255); a port or folder may hold "255"
    assert "code 255" not in reply.text + "\n".join(reply.error["traceback"])
    reply = kernel.ok(NEXT, timeout=180)
    assert reply.stdout.count("next ok") == 2, reply.text
    notes = [line for line in reply.text.splitlines() if "forkserver had ended" in line]
    assert len(notes) == 1 and f"pid {server.pid}" in notes[0], reply.text


HANDLERS = """%%ddp -n 3
import os, time
try:
    print("in", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("saved", os.environ["RANK"], flush=True)
finally:
    print("finally", os.environ["RANK"], flush=True)
"""


@pytest.mark.parametrize("where", ["fresh", "pool"])
def test_interrupt_runs_the_cells_except_and_finally_on_every_rank(kernel, where):
    if where == "pool":
        kernel.ok("%ddp_pool start -n 3", timeout=120)
    try:
        cell = HANDLERS if where == "fresh" else HANDLERS.replace("%%ddp -n 3", "%%ddp")
        reply, sent = interrupt_when(kernel, cell, lambda reply: reply.stdout.count("]:in") == 3)
        took = time.monotonic() - sent[0]
        line = one_line_interrupt(reply)
        assert "nbddp: interrupted" in line, line
        for r in range(3):
            assert f"[rank{r}]:saved {r}\n" in reply.stdout and f"[rank{r}]:finally {r}\n" in reply.stdout, reply.text
        assert took < 2.0, f"{took:.2f} s"
        states = json.loads(kernel.ok("import json; print(json.dumps([r.state for r in _ddp.ranks]))").stdout)
        # a rank whose cell caught the KeyboardInterrupt and ended normally has run to its end
        assert set(states) <= {"interrupted", "ok"}, states
    finally:
        if where == "pool":
            kernel.ok("%ddp_pool stop")


def test_ranks_that_ignore_signals_are_still_ended_within_2_s(kernel):
    reply, sent = interrupt_when(kernel, """%%ddp -n 2
import os, signal
signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("PID", os.getpid(), flush=True)
while True:
    pass
""", lambda reply: reply.stdout.count("PID") == 2)
    took = time.monotonic() - sent[0]
    one_line_interrupt(reply)
    pids = [int(p) for p in re.findall(r"PID (\d+)", reply.stdout)]
    assert not alive(pids), alive(pids)
    assert took < 2.5, f"the interrupt took {took:.2f} s (bound: 2 s)"
    assert kernel.ok(NEXT).stdout.count("next ok") == 2


def test_second_interrupt_kills_a_slow_handler_at_once_and_still_reports(kernel):
    reply, sent = interrupt_when(kernel, """%%ddp -n 2
import os, time
print("PID", os.getpid(), flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    print("saving slowly", flush=True)
    time.sleep(60)
""", lambda reply: reply.stdout.count("PID") == 2,
        lambda reply: reply.stdout.count("saving slowly") == 2 and "interrupt again" in reply.stderr)
    assert 1.5 < sent[1] - sent[0] < 5, "the handlers were given time after the first interrupt"
    assert time.monotonic() - sent[1] < 1.5, "the second interrupt kills at once"
    line = one_line_interrupt(reply)
    assert "interrupted: all ranks were stopped" in line
    assert "still running the cell's interrupt handler" in reply.stderr, reply.stderr
    assert "rank 0: interrupted" in reply.text or "interrupted" in kernel.ok(
        "print([r.state for r in _ddp.ranks])").stdout
    pids = [int(p) for p in re.findall(r"PID (\d+)", reply.stdout)]
    assert not wait_gone(pids, 2)


def test_every_rank_exits_with_a_message_all_failed_with_it(kernel):
    reply = kernel.execute("%%ddp -n 4\nimport sys\nsys.exit('fatal: config missing')\n", timeout=60)
    text = "\n".join(reply.error["traceback"])
    assert reply.error["ename"] == "DDPError", text
    for r in range(4):
        assert f"rank {r}: failed (SystemExit: fatal: config missing at cell line 3)" in text, text
    assert "terminated" not in text and "stopped by nbddp" not in text, text


def test_only_ranks_nbddp_stopped_are_terminated(kernel):
    """Rank 1 fails; rank 0 ignores the SIGTERM and exits by itself with its own code: it
    keeps that code; rank 2 is the one nbddp stopped."""
    reply = kernel.execute("""%%ddp -n 3
import os, signal, sys, time
r = int(os.environ["RANK"])
if r == 1:
    raise ValueError("bad batch")
if r == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(0.8); sys.exit(3)
time.sleep(60)
""", timeout=60)
    text = "\n".join(reply.error["traceback"])
    assert "rank 1: failed (ValueError: bad batch at cell line 5)" in text, text
    assert "rank 2: terminated (stopped by nbddp after rank 1 failed)" in text, text
    assert "rank 0: failed (exited with code 3)" in text, text
