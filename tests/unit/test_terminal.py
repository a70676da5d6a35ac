"""The per-stream terminal model (pure): \\r rewrites the line, \\n ends it, ANSI SGR becomes
styling, other escapes are dropped, long lines stay bounded and linear; and what the views
render from it. (Real ranks' lines in a real kernel: tests/kernel/test_live_lines.py.)"""
import time

from nbddp.views import terminal
from nbddp.views.terminal import Terminal


def test_utf8_stays_whole_across_chunks_and_long_lines_are_bounded():
    t = Terminal(limit=10)
    data = "é\n".encode()
    assert t.feed(data[:1]) == [] and t.feed(data[1:]) == ["é"]
    for _ in range(16):   # a 1 MB line in pieces keeps `limit` characters and counts the rest
        assert t.feed(b"x" * 65536) == []
    assert len(t._plain) <= 10
    (line,) = t.feed(b"\n")
    assert line.startswith("x" * 10) and f"[{16 * 65536 - 10} more characters]" in line
    assert t.feed(b"tail") == [] and t.pending == "tail" and t.flush() == ["tail"] and t.flush() == []


def test_carriage_return_rewrites_the_line_like_a_terminal():
    t = Terminal()
    assert t.feed(b"abc\rX\n") == ["Xbc"]          # overwrite, not replace (as a terminal does)
    for i in range(0, 101, 10):
        assert t.feed(f"\r{i:3d}%|{'#' * (i // 10):10s}|".encode()) == []
        assert t.pending == f"{i:3d}%|{'#' * (i // 10):10s}|"
    assert t.progress == "100%|##########|"
    assert t.feed(b"\n") == ["100%|##########|"] and t.pending == ""
    assert t.progress == "100%|##########|"          # the last progress line is remembered
    assert t.feed(b"done\n") == ["done"] and t.progress == "100%|##########|"
    # \r\n is an ordinary line end; \b steps back
    assert t.feed(b"one\r\ntwo\n") == ["one", "two"]
    assert t.feed(b"abc\x08\x08X\n") == ["aXc"]


def test_sgr_becomes_styled_spans_and_other_escapes_are_dropped():
    t = Terminal()
    (line,) = t.feed(b"\x1b[32mOK\x1b[0m done\n")
    assert terminal.plain(line) == "OK done"
    assert terminal.to_html(line) == '<span style="color:#0dbc79">OK</span> done'
    # an escape split across reads, bold + colour carried over a newline, cursor moves dropped
    assert t.feed(b"\x1b[1;3") == [] and t.feed(b"1mred\nstill\x1b[0m \x1b[2Aplain\x1b]0;title\x07\n") \
        == ["\x1b[0;1;31mred\x1b[0m", "\x1b[0;1;31mstill\x1b[0m plain"]
    assert terminal.to_html("\x1b[0;1;31mred <b>\x1b[0m") == \
        '<span style="color:#cd3131;font-weight:bold">red &lt;b&gt;</span>'
    # erase-in-line (rich, pip): the line is cleared, not appended to
    assert t.feed(b"old text\r\x1b[2Knew\n") == ["new"]
    assert t.feed(b"abcdef\r\x1b[3C\x1b[K\n") == [""]   # cursor moves are dropped; K erases to the end
    assert terminal.to_html("\x1b[0;38;5;196mx\x1b[0m") == '<span style="color:#ff0000">x</span>'


def test_long_line_costs_linear_time_and_bounded_memory():
    chunk, short = b"x" * 65536, (b"y" * 1023 + b"\n") * 64
    timings = []
    for data in (chunk, short):
        t = Terminal()
        start = time.perf_counter()
        for _ in range(400):            # 26 MB
            t.feed(data)
        t.flush()
        timings.append(time.perf_counter() - start)
        assert len(t._plain) <= terminal.MAX_LINE
    single, lines = timings
    assert single < 2 * lines + 0.05, timings
    # a progress bar rewritten 100,000 times is still one line
    t = Terminal()
    for i in range(100_000):
        t.feed(b"\r%d" % i)
    assert t.flush() == ["99999"]
