"""Rank lines as they arrive, in a real kernel: text mode rewrites a progress bar live and ends it as
one line, the widget view shows the pending line live and leaves the static transcript, widget
cells leave no comms behind, and a long line costs linear time with bounded output. (The terminal
model they are rendered by, pure: tests/unit/test_terminal.py.)"""
import os
import time

from test_display import WIDGET_MIME, final_bundle, of_type, run_raw, status_htmls, widget_display

from nbddp.views import terminal
from nbddp.views.terminal import Terminal

TQDM = """%%ddp -n 2 --output {mode}
import os, sys, time
from tqdm import tqdm
for i in tqdm(range(40), mininterval=0, ascii=True):
    time.sleep(0.05)
print("\\033[32mOK\\033[0m from", os.environ["RANK"])
sys.stdout.flush(); time.sleep(0.5)
print("rank done")
"""


def _arrival(messages, needle):
    """Index of the first output message (not the cell's source) whose content contains ``needle``."""
    return next(i for i, m in enumerate(messages) if m["msg_type"] != "execute_input" and needle in str(m["content"]))


def _screen(text: str) -> list[str]:
    """What a terminal (or Jupyter) shows for a stream's text: \\r rewritten lines folded."""
    t = Terminal()
    return [terminal.plain(line) for line in t.feed(text.encode()) + t.flush()]


def test_text_mode_progress_bar_updates_live_and_ends_as_one_line(kernel):
    messages, reply = run_raw(kernel, TQDM.format(mode="text"))
    assert reply["status"] == "ok", reply
    streams = of_type(messages, "stream")
    err = "".join(m["content"]["text"] for m in streams if m["content"]["name"] == "stderr")
    out = "".join(m["content"]["text"] for m in streams if m["content"]["name"] == "stdout")
    # live: rewrites of the bar arrived as stream messages before the rank's last line
    live = [i for i, m in enumerate(messages) if m["msg_type"] == "stream"
            and "\r[rank0]:" in m["content"]["text"] and "/40" in m["content"]["text"]]
    assert live and live[0] < _arrival(messages, "[rank0]:rank done"), err[:500]
    # ... a few times a second, not once per refresh
    assert 2 <= err.count("\r[rank0]:") <= 25, err.count("\r[rank0]:")
    shown = _screen(err)
    bars = [line for line in shown if line.startswith("[rank0]:") and "/40" in line]
    assert len(bars) == 1 and "100%" in bars[0] and "40/40" in bars[0], shown
    # colours pass through to Jupyter (which renders ANSI), reset at the end of the line
    assert "[rank0]:\x1b[0;32mOK\x1b[0m from 0\n" in out
    # the static transcript after it is the status alone: the bars and lines were streamed above
    # (the widget view's transcript, below, renders them)
    data = final_bundle(messages)
    assert "rank 1: ok" in data["text/plain"] and "/40" not in data["text/plain"], data
    # on the chips
    assert data["text/html"].count("/40") == 2 and data["text/html"].count('class="nbddp-progress"') == 2
    assert "from 1" not in data["text/plain"] + data["text/html"], data


def test_widgets_show_the_pending_line_live_and_leave_the_static_transcript(kernel):
    messages, reply = run_raw(kernel, TQDM.format(mode="widgets"))
    assert reply["status"] == "ok", reply
    values = [(i, str(m["content"]["data"].get("state", {}).get("value", "")))
              for i, m in enumerate(messages) if m["msg_type"] in ("comm_open", "comm_msg")]
    # the bar (no newline yet) was in the pane while the rank ran, and on its chip
    live = [i for i, v in values if "/40" in v and "100%" not in v and "nbddp-chip" not in v]
    assert live and live[0] < _arrival(messages, "rank done")
    assert any('class="nbddp-progress"' in v and "/40" in v for v in status_htmls(messages))
    assert any('<span style="color:#0dbc79">OK</span> from 0' in v for _, v in values)
    # the durable output: the status display, now the transcript only, and every widget closed
    first = of_type(messages, "display_data")[0]["content"]
    update = of_type(messages, "update_display_data")[-1]["content"]
    assert update["transient"]["display_id"] == first["transient"]["display_id"]
    assert widget_display(messages) and WIDGET_MIME not in update["data"]
    assert "nbddp-chip nbddp-ok" in update["data"]["text/html"] and "rank 1: ok" in update["data"]["text/plain"]
    bars = [line for line in update["data"]["text/plain"].splitlines() if "/40" in line]
    assert len(bars) == 2 and all("100%" in b for b in bars), bars
    assert '<span style="color:#0dbc79">OK</span> from 1' in update["data"]["text/html"]  # the colour as a span
    opened = {m["content"]["comm_id"] for m in of_type(messages, "comm_open")}
    closed = {m["content"]["comm_id"] for m in of_type(messages, "comm_close")}
    assert opened and opened <= closed, f"{len(opened - closed)} of {len(opened)} widgets left open"


CELLS = int(os.environ.get("NBDDP_LEAK_CELLS", "100"))   # 200 measured: comms 0 -> 0, RSS +4.2 MB


def test_widget_cells_leave_no_comms_and_little_memory(kernel):
    probe = ("import comm, psutil, os, gc; gc.collect(); "
             "print(len(comm.get_comm_manager().comms), psutil.Process(os.getpid()).memory_info().rss)")
    cell = "%%ddp -n 2 --output widgets\nimport os; print('hello', os.environ['RANK'])\n"
    kernel.ok(cell)
    comms0, rss0 = map(int, kernel.ok(probe).stdout.split())
    for _ in range(CELLS):
        kernel.ok(cell)
    comms, rss = map(int, kernel.ok(probe).stdout.split())
    print(f"{CELLS} widget cells: comms {comms0} -> {comms}, kernel RSS +{(rss - rss0) / 1e6:.1f} MB")
    assert comms <= comms0 and rss - rss0 < 10e6


def test_text_mode_long_line_is_linear_and_output_bounded(kernel):
    single = """%%ddp -n 1 --output text
import sys
chunk = "x" * 65536
for _ in range(800):   # 52 MB, one line
    sys.stdout.write(chunk)
sys.stdout.write("\\n"); sys.stdout.flush()
"""
    short = """%%ddp -n 1 --output text
import sys
chunk = ("y" * 1023 + "\\n") * 64
for _ in range(800):   # 52 MB in 51,200 lines
    sys.stdout.write(chunk)
sys.stdout.flush()
"""
    timings, sent = {}, {}
    for name, cell in (("single", single), ("short", short)):
        start = time.monotonic()
        messages, reply = run_raw(kernel, cell)
        timings[name] = time.monotonic() - start
        assert reply["status"] == "ok"
        sent[name] = sum(len(m["content"]["text"]) for m in of_type(messages, "stream"))
    print(f"text mode, 52 MB: one line {timings['single']:.2f} s, short lines {timings['short']:.2f} s; "
          f"sent {sent['single'] / 1e6:.2f} / {sent['short'] / 1e6:.2f} MB")
    assert timings["single"] <= 2 * timings["short"], timings
    assert sent["single"] < 2.1e6 and sent["short"] < 6e6, sent   # a line: 2 MB at most
    r = kernel.ok("print(len(_ddp.ranks[0].stdout))")   # every byte is in the log
    assert r.stdout.strip() == str(52_428_800)
