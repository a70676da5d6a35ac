"""--push and --pull in a real kernel: a push is serialized once into one shared file (the
kernel's memory does not grow with ranks x size), and a pull that cannot be honoured raises
instead of leaving None in the notebook."""
import threading
import time

import psutil

SIZE = 200_000_000  # bytes: a 50M-element float32 tensor


class PeakRSS:
    """The kernel's resident memory, sampled every few ms while a cell runs."""

    def __init__(self, pid):
        self.proc, self.peak, self.stop = psutil.Process(pid), 0, threading.Event()
        self.base = self.proc.memory_info().rss
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    @property
    def growth(self):
        return self.peak - self.base


COUNTED = """
pickled = 0
class Counted:
    \"\"\"Counts, in the kernel, how often it is serialized (each pickle calls __reduce__).\"\"\"
    def __reduce__(self):
        global pickled
        pickled += 1
        return (int, (7,))
counted = Counted()
"""


def test_push_is_serialized_once_and_shared(kernel):
    kernel.ok("import torch\nbig = torch.randn(50_000_000)\nexpected = int(big.view(torch.int32).sum())")
    kernel.ok(COUNTED)
    kernel.ok("%%ddp -n 4\npass")  # warm: the forkserver and spares are up
    with PeakRSS(kernel.pid) as rss:
        reply = kernel.ok("%%ddp -n 4 --push big,counted --output text\n"
                          "import os, torch\n"
                          "print('sum', os.environ['RANK'], counted, int(big.view(torch.int32).sum()))")
    expected = int(kernel.ok("print(expected)").stdout)
    sums = [line.split()[-2:] for line in reply.stdout.splitlines() if ":sum " in line]
    # the bits, summed as integers: exact whatever order (a float32 sum differs with the thread
    # count, and ranks run with OMP_NUM_THREADS=1)
    assert sums == [["7", str(expected)]] * 4, reply.stdout
    # once for 4 ranks (it was once per rank, over a pipe each: 1.39 GB peak for this push)
    assert kernel.ok("print(pickled)").stdout.strip() == "1"
    assert rss.growth < 1.2 * SIZE, f"kernel grew {rss.growth / 1e6:.0f} MB for a 200 MB push"
    left = kernel.ok("import os, nbddp.kernel.pushing as p; print(os.listdir(p._folder))").stdout
    assert left.strip() == "[]", left  # the shared file is gone once the cell ended
    kernel.ok("del big")


def _assert_pull_error(reply, *phrases):
    assert reply.error and reply.error["ename"] == "PullError", reply.text
    text = "\n".join(reply.error["traceback"])
    for phrase in phrases:
        assert phrase in text, text


def test_pull_of_a_missing_name_raises_and_keeps_the_notebook_value(kernel):
    kernel.ok("model_state = 'before'; x = 'before'")
    reply = kernel.execute("%%ddp -n 2\nimport os\nif os.environ['RANK'] == '1':\n    model_state = 1")
    assert not reply.error
    reply = kernel.execute("%%ddp -n 2 --pull model_state@0\nimport os\n"
                           "if os.environ['RANK'] == '1':\n    model_state = {'w': 1}")
    _assert_pull_error(reply, "--pull model_state@0: rank 0 has no name 'model_state'",
                       "left as they were")
    reply = kernel.execute("%%ddp -n 4 --pull x\nimport os\nif int(os.environ['RANK']) % 2 == 0:\n"
                           "    x = int(os.environ['RANK']) * 10")
    _assert_pull_error(reply, "ranks 1,3 have no name 'x'")
    kernel.ok("assert model_state == 'before' and x == 'before', (model_state, x)")
    kernel.ok("%%ddp -n 4 --pull x\nimport os\nx = int(os.environ['RANK']) * 10")
    kernel.ok("assert x == [0, 10, 20, 30], x")


def test_pull_of_an_unpicklable_value_raises_naming_the_rank(kernel):
    kernel.ok("gen = 'before'")
    reply = kernel.execute("%%ddp -n 2 --pull gen,ok\ngen = (i for i in range(3)); ok = 1")
    _assert_pull_error(reply, "rank 0 could not send 'gen' back: generator cannot be pickled",
                       "rank 1 could not send 'gen' back")
    kernel.ok("assert gen == 'before'")
    # a failed cell pulls nothing either
    reply = kernel.execute("%%ddp -n 2 --pull gen\ngen = 5\nraise ValueError('bad')")
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    kernel.ok("assert gen == 'before'")


def test_input_in_a_rank_fails_at_once_with_the_hint(kernel):
    """Where no front end can answer (papermill, nbclient: allow_stdin False); with one, the
    notebook's input box asks (tests/kernel/test_debugger.py)."""
    reply = kernel.execute("%%ddp -n 2\nlr = float(input('learning rate? '))", allow_stdin=False)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    text = "\n".join(reply.error["traceback"])
    assert "NoStdin: input('learning rate? '): ranks have no stdin" in text, text
    assert "at cell line 2" in text and "): a rank has no stdin" in text, text  # either rank first
    assert "--push NAME" in text, text
