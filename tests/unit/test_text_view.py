"""The text view, pure: paced under the notebook server's rate limit (nothing lost without saying
so), lines rewritten in place as front ends render them, identical lines of several ranks once.
A fake clock drives it; the front end is JupyterLab's own \\r algorithm (tests/support/frontend.py)."""
from __future__ import annotations

import re
from types import SimpleNamespace

from nbddp.core.iopubrate import SERVER_DATA_RATE, SERVER_WINDOW_S, RateWindow, stream_bytes
from nbddp.core.launchrules import make_spec
from nbddp.views.textview import TextView
from support.frontend import visible_lines


class Streams:
    """stdout and stderr as a kernel sends them: (name, text) messages in write order, with the
    fake clock's time of each write."""

    def __init__(self, clock):
        self.messages, self.times, self.clock = [], [], clock

    def of(self, name):
        streams = self

        class _Out:
            def write(self, text):
                streams.messages.append((name, text))
                streams.times.append(streams.clock())

            def flush(self):
                pass
        return _Out()


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def make_view(n=4, same_lines="apart", **spec):
    clock = Clock()
    streams = Streams(clock)
    view = TextView(make_spec(n=n, output="text", same_lines=same_lines, **spec), out=streams.of("stdout"),
                    err=streams.of("stderr"), header=False, window=RateWindow(), clock=clock, sleep=clock.sleep)
    result = SimpleNamespace(log_dir="/tmp/nbddp-test/launch-1", ranks=[])
    view.launch_started(result, None, "gloo")
    return view, clock, streams, result


def server_drops(streams) -> bool:
    """jupyter_server's iopub data limiter over these writes (each write one message, at its time)."""
    window = []
    for (_name, text), t in zip(streams.messages, streams.times, strict=True):
        window = [(u, b) for u, b in window if u > t - SERVER_WINDOW_S] + [(t, stream_bytes(text) + 700)]
        if sum(b for _, b in window) / SERVER_WINDOW_S > SERVER_DATA_RATE:
            return True
    return False


def test_a_flood_is_paced_under_the_servers_limit_and_every_line_is_shown_or_said_held_back():
    view, clock, streams, result = make_view(n=4)
    lines = 50_000
    for step in range(200):   # 4 ranks × 50,000 lines in 2 s, then 4 s of quiet
        for rank in range(4):
            chunk = "".join(f"step {i}\n" for i in range(step * 250, step * 250 + 250))
            view.output(rank, "stdout", chunk.encode())
        clock.t += 0.01
        if step % 10 == 9:
            view.tick()
    for _ in range(40):
        clock.t += 0.1
        view.tick()
    view.launch_finished(result)
    assert not server_drops(streams)
    shown = {r: set() for r in range(4)}
    for _name, text in streams.messages:
        for m in re.finditer(r"^\[rank(\d)\]:step (\d+)$", text, re.M):
            shown[int(m[1])].add(int(m[2]) + 1)          # line numbers count from 1, as in the log
    held = {r: set() for r in range(4)}
    notes = [text for name, text in streams.messages if name == "stderr"]
    for note in notes:
        for m in re.finditer(r"rank (\d) stdout lines? ([\d,]+)(?:–([\d,]+))?", note):
            a = int(m[2].replace(",", ""))
            b = int((m[3] or m[2]).replace(",", ""))
            held[int(m[1])] |= set(range(a, b + 1))
    for r in range(4):
        assert not shown[r] & held[r]
        assert shown[r] | held[r] == set(range(1, lines + 1)), r
        assert shown[r] and held[r]
    final = notes[-1]
    total = sum(len(h) for h in held.values())
    assert f"nbddp: {total:,} lines not shown here" in final and "rank 3: " in final
    assert "notebook server" in final and result.log_dir in final


def test_the_end_of_cell_note_waits_for_room_in_the_window():
    view, clock, streams, result = make_view(n=1)
    view.output(0, "stderr", b"".join(b"x" * 100 + b"\n" for _ in range(40_000)))   # 4 MB at once
    start = clock.t
    view.launch_finished(result)
    assert clock.t > start                     # it waited for the window to drain, boundedly
    assert clock.t - start <= SERVER_WINDOW_S + 1
    assert "not shown here" in streams.messages[-1][1]
    assert not server_drops(streams)


BARS = {   # each rank's progress bar: colours, emoji, CJK, each step rewriting the line with \r
    0: lambda i: f"\x1b[32m训练 {i * 10:3d}%\x1b[0m |{'█' * i}{' ' * (10 - i)}| 🚀",
    1: lambda i: f"\x1b[1;34mepoch 1\x1b[0m 🔥 {'進' * i}{'.' * (10 - i)} {i:2d}/10",
}


def test_rewritten_lines_of_two_ranks_leave_nothing_behind_as_jupyterlab_renders_them():
    view, clock, streams, result = make_view(n=2)
    for i in range(11):
        for rank in (0, 1):
            view.output(rank, "stdout", ("\r" + BARS[rank](i)).encode())
            clock.t += 0.2
            view.tick()
        if i % 3 == 0:   # finished lines of each rank between the rewrites
            view.output(1, "stderr", f"loss {i}\n".encode())
            view.output(0, "stderr", f"warn {i}\n".encode())
            clock.t += 0.2
            view.tick()
    for rank in (0, 1):
        view.output(rank, "stdout", b"\n")
    view.launch_finished(result)
    assert view.pending_writes >= 10
    plain = re.compile(r"\x1b\[[0-9;]*m")
    expected = {f"[rank1]:loss {i}" for i in range(0, 11, 3)} | {f"[rank0]:warn {i}" for i in range(0, 11, 3)}
    expected |= {"[rank0]:" + plain.sub("", BARS[0](10)), "[rank1]:" + plain.sub("", BARS[1](10))}
    seen = visible_lines(streams.messages)
    assert set(seen) == expected, seen


def test_identical_lines_of_several_ranks_are_written_once_and_different_ones_apart():
    view, clock, streams, result = make_view(n=4, same_lines="merge")
    for rank in (2, 0, 3, 1):
        view.output(rank, "stdout", f"epoch 1 done\nrank {rank} loss 0.{rank}\n".encode())
    clock.t += 1
    view.tick()
    for rank in range(4):
        view.output(rank, "stdout", b"epoch 2 done\n" if rank != 3 else b"")
    clock.t += 0.1
    view.tick()
    view.launch_finished(result)
    out = "".join(text for name, text in streams.messages if name == "stdout")
    assert out.count("epoch 1 done") == 1 and "[ranks 0–3]:epoch 1 done\n" in out
    assert all(f"[rank{r}]:rank {r} loss 0.{r}\n" in out for r in range(4))
    assert "[ranks 0–2]:epoch 2 done\n" in out
    assert out.index("epoch 1 done") < out.index("loss") < out.index("epoch 2 done")


def test_apart_writes_every_ranks_line():
    view, clock, streams, result = make_view(n=2, same_lines="apart")
    for rank in (0, 1):
        view.output(rank, "stdout", b"epoch 1 done\n")
    view.launch_finished(result)
    out = "".join(text for _, text in streams.messages)
    assert "[rank0]:epoch 1 done\n" in out and "[rank1]:epoch 1 done\n" in out


def test_a_terminal_has_no_server_between_so_nothing_is_paced():
    clock = Clock()
    streams = Streams(clock)
    view = TextView(make_spec(n=1, output="text"), out=streams.of("stdout"), err=streams.of("stderr"),
                    header=False, clock=clock, sleep=clock.sleep)   # no window: as outside a kernel
    result = SimpleNamespace(log_dir="/tmp/nbddp-test/launch-1", ranks=[])
    view.launch_started(result, None, "gloo")
    view.output(0, "stdout", b"".join(b"x" * 100 + b"\n" for _ in range(40_000)))   # 4 MB at once
    view.launch_finished(result)
    assert "".join(t for _, t in streams.messages).count("x" * 100) == 40_000
    assert clock.t == 1000.0
