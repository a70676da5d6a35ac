"""A rank's stack file appears only once its SIGUSR1 handler is in place: the kernel asks a rank
whose stack file exists, and falls back to SIGUSR1 where no answering thread reads its FIFO yet; a
SIGUSR1 before the handler would kill the rank (an idle warning during a slow start)."""
import subprocess
import sys

PROBE = """
import faulthandler, os, sys
from nbddp.rank import stackwatch
path = sys.argv[1]
seen = []
real = faulthandler.register
def register(*args, **kwargs):
    seen.append(os.path.exists(path))     # what a kernel asking at this moment would find
    return real(*args, **kwargs)
faulthandler.register = register
stackwatch.serve(path)
os.kill(os.getpid(), stackwatch.SIGNAL)   # the fallback signal, now answered, not fatal
print(seen, os.path.exists(path), sorted(os.listdir(os.path.dirname(path))))
"""


def test_the_stack_file_appears_after_the_signal_handler(tmp_path):
    path = str(tmp_path / "rank0.stacks")
    done = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # not there while the handler was registered; there after, with its FIFO, nothing else left
    assert done.stdout.split("\n")[0] == "[False] True ['rank0.stacks', 'rank0.stacks.ask']", done.stdout
    assert "Current thread" in open(path).read()
