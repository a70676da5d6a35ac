"""diagnosis on real processes: the most common error texts produced again for real get their
hints, and stacks and crash lines are read from real faulthandler output. (The hint table and the
parsing on the texts alone: tests/unit/test_diagnosis_texts.py.)"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import nbddp
from nbddp.core import diagnosis


def _plain_python(code):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_real_env_without_launcher_and_no_process_group_get_hints():
    out = _plain_python("""
        import torch, torch.distributed as dist
        for call in (lambda: dist.init_process_group("gloo", rank=0, world_size=1),
                     lambda: dist.init_process_group("gloo"),
                     lambda: dist.all_reduce(torch.ones(1))):
            try:
                call()
            except Exception as e:
                print(repr(str(e)))
    """)
    lines = [eval(line) for line in out.stdout.splitlines()]
    assert len(lines) == 3, out.stderr
    assert "MASTER_ADDR expected" in lines[0] and "RANK expected" in lines[1]
    assert "Run this under %%ddp" in diagnosis.hint_for(lines[0])
    assert "Run this under %%ddp" in diagnosis.hint_for(lines[1])
    assert "Default process group has not been initialized" in lines[2]
    assert "init_process_group" in diagnosis.hint_for(lines[2])


def test_real_mismatched_collectives_with_detail_get_the_hint():
    result = nbddp.run("""
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(3))
else:
    dist.broadcast(torch.ones(2), 0)
""", n=2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=30, check=False, sinks=[])
    assert not result.timed_out, "DETAIL did not detect the mismatch (is the env read in the rank?)"
    failed = [r for r in result.ranks if r.state == "failed"]
    assert failed, result.summary()
    assert "Detected mismatch between collectives" in failed[0].cause
    assert "different collectives" in failed[0].hint


def test_real_rank_that_exits_while_others_wait_gets_the_hint():
    result = nbddp.run("""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    os._exit(0)
dist.all_reduce(torch.ones(1))
""", n=2, timeout=30, check=False, sinks=[])
    rank0 = result.ranks[0]
    assert rank0.state == "failed", result.summary()
    assert "another rank ended" in rank0.hint
    assert "at cell line 6" in rank0.cause


# ---------------------------------------------------------------------------- stacks
SCRIPT = '''\
import faulthandler, signal, sys, threading, time
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "w"), all_threads=True)
def spin_forever():
    while True:
        time.sleep(0.01)
def wait_for_peer(event):
    event.wait()
threading.Thread(target=spin_forever, name="helper", daemon=True).start()
print("ready", flush=True)
wait_for_peer(threading.Event())
'''


def test_stacks_from_a_real_process(tmp_path):
    script = tmp_path / "cell.py"
    script.write_text(SCRIPT)
    stacks = tmp_path / "stacks.txt"
    proc = subprocess.Popen([sys.executable, str(script), str(stacks)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGUSR1)
        # a signal's dump has no end mark: complete when it looks so and stops growing
        deadline, before = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            text = stacks.read_text()
            if diagnosis.stack_complete(text) and text == before:
                break
            before = text
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    text = stacks.read_text()
    threads = diagnosis.parse_stacks(text)
    assert len(threads) == 2, text
    files = {file for frames in threads for file, _, _ in frames}
    assert str(script) in files
    main = [frames for frames in threads if frames[-1][2] == "<module>"][0]
    assert (str(script), 10, "<module>") in main and (str(script), 7, "wait_for_peer") in main
    assert main[0][2] == "wait" and main[0][0].endswith("threading.py")
    # the main thread is where the rank is blocked, even when a cell thread is listed first
    where = diagnosis.blocked_at(text, str(script), SCRIPT)
    assert where == "cell line 7: event.wait() (in wait)", (where, text)


def test_crash_line_from_a_real_segfault(tmp_path):
    script = tmp_path / "cell.py"
    script.write_text("import ctypes, faulthandler\nfaulthandler.enable()\n"
                      "def crash():\n    ctypes.string_at(0)\ncrash()\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGSEGV, proc
    assert diagnosis.crash_line(proc.stderr, str(script)) == "cell line 4: ctypes.string_at(0) (in string_at)"
    assert diagnosis.crash_line("no crash report here", str(script)) is None


def test_second_stack_collection_has_no_nul_hole():
    """The idle warning and then the timeout each ask for stacks; the launcher truncates the
    stack file in between, so the rank must append (a plain "w" offset left NUL bytes)."""
    result = nbddp.run("import time\nfor _ in range(600):\n    time.sleep(0.1)\n", n=2, timeout=6,
                       idle_warning=3, check=False, sinks=[])
    assert result.timed_out and any(n.startswith("warning: no output") for n in result.notes), result.notes
    for r in result.ranks:
        assert r.stack and "\0" not in r.stack, repr((r.stack or "")[:80])
        assert r.stack.startswith("Thread 0x"), repr(r.stack[:80])


STACKS_UNDISTURBED = """import ctypes, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
libc = ctypes.CDLL(None, use_errno=True)
class timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(1))
while True:  # as c10d's retry sleep: C code that a signal would cut short with EINTR
    if libc.nanosleep(ctypes.byref(timespec(0, 100_000_000)), None) != 0:
        print("nanosleep:", os.strerror(ctypes.get_errno()), flush=True)
"""


def test_stacks_are_read_without_interrupting_system_calls(kernel):
    """--timeout and the idle warning ask for stacks; a signal interrupted the ranks' system calls
    (c10d printed "Interrupted system call" and its C++ frames). Asked through the rank's own
    thread, nothing in the rank is disturbed and the report still names each rank's line."""
    reply = kernel.execute(f"%%ddp -n 2 --timeout 10 --idle-warning 4 --output text\n{STACKS_UNDISTURBED}",
                           timeout=120)
    assert reply.error and reply.error["ename"] == "DDPTimeout", reply.text[-2000:]
    out = kernel.ok("r = _ddp\nprint([x.blocked_at for x in r.ranks])\n"
                    "print('OUTPUT', repr(''.join(x.stdout + x.stderr for x in r.ranks)))\n"
                    "print('NOTES', r.notes)").stdout
    assert "cell line 8: dist.all_reduce(torch.ones(1)) (in all_reduce)" in out, out
    assert "cell line 10: if libc.nanosleep(" in out, out
    assert "no output from any rank" in out, out  # the idle warning asked too
    # it was given
    assert "--timeout 10 stops the cell 10 s after it started" in out and "use --timeout" not in out, out
    assert "Interrupted system call" not in out + reply.text and "frame #" not in out, out
