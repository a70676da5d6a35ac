"""Text mode as a notebook front end renders it, in a real kernel: two ranks rewrite coloured,
emoji and CJK progress lines with \\r while finished lines come on stderr; the stream messages,
in the order the kernel sent them, rendered by JupyterLab's own algorithm (tests/support/frontend.py),
show each rank's finished lines and final bars and nothing left of a line shown in place."""
import re

import pytest

from support.frontend import visible_lines

CELL = r"""%%ddp -n 2 --output text
import os, sys, time
rank = int(os.environ["RANK"])
bars = {0: lambda i: f"\x1b[32m训练 {i * 10:3d}%\x1b[0m |{'█' * i}{' ' * (10 - i)}| 🚀",
        1: lambda i: f"\x1b[1;34mepoch 1\x1b[0m 🔥 {'進' * i}{'.' * (10 - i)} {i:2d}/10"}
for i in range(11):
    sys.stdout.write("\r" + bars[rank](i)); sys.stdout.flush()
    if i % 3 == 0:
        print(f"note {i}", file=sys.stderr, flush=True)
    time.sleep(0.25)
print(flush=True)
"""


def test_progress_lines_of_two_ranks_render_clean_in_jupyterlab(kernel):
    msg_id = kernel.kc.execute(CELL)
    streams = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            streams.append((msg["content"]["name"], msg["content"]["text"]))
        if msg["msg_type"] == "error":
            pytest.fail("\n".join(msg["content"]["traceback"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert sum(text.count("\r[rank") for _, text in streams) >= 4, streams   # the bars were shown in place
    seen = [line for line in visible_lines(streams) if line.startswith("[rank")]
    plain = re.compile(r"\x1b\[[0-9;]*m")
    final = {0: f"\x1b[32m训练 100%\x1b[0m |{'█' * 10}| 🚀", 1: f"\x1b[1;34mepoch 1\x1b[0m 🔥 {'進' * 10} 10/10"}
    expected = {f"[rank{r}]:note {i}" for r in (0, 1) for i in range(0, 11, 3)}
    expected |= {f"[rank{r}]:" + plain.sub("", final[r]) for r in (0, 1)}
    assert set(seen) == expected, seen
