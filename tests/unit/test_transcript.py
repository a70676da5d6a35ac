"""The static transcript (pure): bounded tails, splitting, text/plain and text/html rendering."""
import html
import re

from nbddp.core.launchrules import make_spec
from nbddp.core.result import FAILED, OK, RankResult, RunResult
from nbddp.views import transcript


def _result(n, states=None, log_dir="/tmp/logs"):
    ranks = []
    for r in range(n):
        rr = RankResult(rank=r, local_rank=r, node_rank=0, started_at=100.0, ended_at=101.5,
                        state=(states or {}).get(r, OK), stdout_path=f"{log_dir}/rank{r}.stdout")
        rr.exitcode = 0 if rr.state == OK else 1
        ranks.append(rr)
    return RunResult(ranks=ranks, world_size=n, log_dir=log_dir, started_at=100.0, ended_at=101.6)


def _collector(spec, result):
    c = transcript.Collector(spec)
    c.launch_started(result, spec, "gloo")
    return c


def test_tail_is_bounded_and_counts_hidden_lines():
    t = transcript.Tail(size=5)
    t.add("stdout", [str(i) for i in range(3)])
    t.add("stderr", [str(i) for i in range(3, 12)])
    assert t.total == 12 and t.hidden == 7
    assert [x for _, x in t.lines] == ["7", "8", "9", "10", "11"]


def test_text_and_html_carry_every_rank_status_and_output_with_stderr_distinct():
    spec = make_spec(n=2)
    c = _collector(spec, _result(2, {1: FAILED}))
    c.result.ranks[1].cause = "ValueError: boom"
    c.output(0, "stdout", b"hello from zero\n")
    c.output(1, "stderr", b"Traceback <bad> & more\n")
    c.output(1, "stdout", b"no newline at end")
    for r in c.result.ranks:
        c.rank_exited(r)
    c.launch_finished(c.result)
    b = transcript.bundle(c)
    text, page = b["text/plain"], b["text/html"]
    assert "rank 0: ok 1.5 s exit 0" in text and "rank 1: failed 1.5 s exit 1 — ValueError: boom" in text
    assert "--- rank 0 (1 line) ---\nhello from zero\n" in text
    assert "stderr| Traceback <bad> & more" in text and "no newline at end" in text
    assert "1 not ok (failed)" in text.splitlines()[0]
    # html: escaped, stderr in its own styled span, one section per rank, chips with states
    assert "Traceback &lt;bad&gt; &amp; more" in page and "<bad>" not in page
    assert re.search(r'<span class="nbddp-stderr" style="[^"]+">Traceback', page)
    assert "hello from zero" in page
    assert 'class="nbddp-stderr"' not in page.split("hello from zero")[0].split("<pre")[-1]
    assert page.count("<details") == 2
    assert "nbddp-chip nbddp-ok" in page and "nbddp-chip nbddp-failed" in page
    assert html.escape("ValueError: boom") in page


def test_hidden_marker_and_log_path_after_a_flood():
    spec = make_spec(n=1)
    c = _collector(spec, _result(1))
    chunk = b"".join(b"line %d\n" % i for i in range(200_000))
    for i in range(0, len(chunk), 65536):
        c.output(0, "stdout", chunk[i:i + 65536])
    c.launch_finished(c.result)
    assert c.tails[0].total == 200_000 and len(c.tails[0].lines) == transcript.TAIL_LINES
    b = transcript.bundle(c)
    hidden = 200_000 - transcript.TRANSCRIPT_LINES
    assert f"… {hidden} earlier lines hidden (full log: /tmp/logs/rank0.stdout)" in b["text/plain"]
    assert f"{hidden} earlier lines hidden" in b["text/html"] and "line 199999" in b["text/html"]
    assert "line 199799\n" not in b["text/plain"] and "line 199800\n" in b["text/plain"]
    assert len(b["text/html"]) < 100_000 and len(b["text/plain"]) < 100_000


def test_ranks_shown_filters_sections_but_keeps_every_status():
    spec = make_spec(n=3, ranks_shown=(0, 2))
    c = _collector(spec, _result(3))
    for r in range(3):
        c.output(r, "stdout", f"out {r}\n".encode())
    c.launch_finished(c.result)
    text = transcript.render_text(c)
    assert "--- rank 0" in text and "--- rank 2" in text and "--- rank 1" not in text
    assert "out 1" not in text and "rank 1: ok" in text


def test_displays_rendered_in_html():
    spec = make_spec(n=1)
    c = _collector(spec, _result(1))
    c.display(0, {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
    c.display(0, {"text/html": "<table><tr><td>1</td></tr></table>", "text/plain": "df"})
    c.launch_finished(c.result)
    page = transcript.render_html(c)
    assert '<img src="data:image/png;base64,iVBORw0KGgo="/>' in page and "<table><tr><td>1</td></tr></table>" in page
    assert "[2 rich outputs]" in transcript.render_text(c)
    assert "<img" not in transcript.render_html(c, streamed=True)


def test_after_text_mode_streamed_every_line_the_transcript_says_the_status_alone():
    """A saved notebook carries each line once: text mode streamed them ([rankN]: lines), so the
    transcript after them is the status (headline, logs, each rank's state), not the lines again."""
    spec = make_spec(n=2)
    c = _collector(spec, _result(2))
    for r in range(2):
        c.output(r, "stdout", f"the line of rank {r}\n".encode())
    c.launch_finished(c.result)
    streamed = transcript.bundle(c, streamed=True)
    for form in ("text/plain", "text/html"):
        assert "the line of rank" not in streamed[form], streamed[form]
        assert "rank 0: ok" in streamed[form] and "rank 1: ok" in streamed[form], streamed[form]
        assert "the line of rank 1" in transcript.bundle(c)[form]  # widgets' transcript: the lines are only here


def test_sixteen_ranks_one_failure_said_once():
    from nbddp.core.result import TERMINATED, DDPError
    spec = make_spec(n=16)
    result = _result(16, {r: TERMINATED for r in range(16) if r != 11} | {11: FAILED})
    for r in result.ranks:
        if r.state == TERMINATED:
            r.exitcode, r.cause = -15, "stopped by nbddp after rank 11 failed"
    result.ranks[11].cause = "ValueError: broke"
    c = _collector(spec, result)
    c.output(11, "stderr", b"ValueError: broke\n")
    c.launch_finished(result)
    text, page = transcript.render_text(c), transcript.render_html(c)
    group = "ranks 0–10,12–15: terminated (stopped by nbddp after rank 11 failed)"
    assert text.count(group) == 1 and "rank 11: failed (ValueError: broke)" in text
    assert "exit -15" not in text + page and "stopped (SIGTERM)" in transcript.status_words(result.ranks[0])
    assert "--- rank 0 " not in text and "ranks 0–10,12–15: terminated, no output" in text
    chips = re.findall(r'class="nbddp-chip[^"]*"', page)
    assert chips == ['class="nbddp-chip nbddp-failed"', 'class="nbddp-chip nbddp-group nbddp-terminated"']
    assert page.count(group) == 1 and page.count("<details open>") == 1
    error = str(DDPError(result))
    assert error.count("terminated") == 1 and group in error


def test_rich_output_keeps_its_place_among_the_lines():
    spec = make_spec(n=1)
    c = _collector(spec, _result(1))
    c.output(0, "stdout", b"before the plot\n")
    c.display(0, {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
    c.output(0, "stdout", b"after the plot\n")
    c.launch_finished(c.result)
    page = transcript.render_html(c)
    assert page.index("before the plot") < page.index("<img") < page.index("after the plot")


def test_sections_open_only_for_failed_ranks_and_scroll_with_their_end_in_view():
    spec = make_spec(n=3)
    c = _collector(spec, _result(3, {2: FAILED}))
    for r in range(3):
        c.output(r, "stdout", b"".join(b"line %d of rank %d\n" % (i, r) for i in range(300)))
    c.launch_finished(c.result)
    page = transcript.render_html(c)
    opened = re.findall(r"<details open><summary>rank (\d)", page)
    assert opened == ["2"] and page.count("<details>") == 2
    assert page.count('class="nbddp-section"') == 3 and "max-height:26em;overflow:auto" in page
    assert "flex-direction:column-reverse" in page   # the section shows its last lines first
    # nothing failed: the first rank open (as the live view showed it), the others folded
    ok = _collector(spec, _result(3))
    ok.output(1, "stdout", b"x\n")
    ok.launch_finished(ok.result)
    assert re.findall(r"<details open><summary>rank (\d)", transcript.render_html(ok)) == ["0"]


def test_chips_copy_apart_keep_a_bars_spaces_and_take_the_themes_colours():
    c = _collector(make_spec(n=2), _result(2, {1: FAILED}))
    c.result.ranks[1].cause = "ValueError: boom"
    chips = transcript.chips_html(c.result, progress=lambda r: "40%|####  | 4/10" if r == 0 else "")
    text = re.sub(r"<[^>]+>", "", chips)
    assert "exit 0 40%|####  | 4/10 · rank 1: failed" in html.unescape(text)
    assert "white-space:pre" in chips
    page = transcript.render_html(c)
    assert "var(--jp-content-font-color0" in page and "var(--jp-layout-color0" in page
    assert "var(--jp-rendermime-error-background" in transcript.lines_html([("stderr", "bad")])
    assert not re.search(r"color:#[0-9a-f]{3,6}[;\"]", page), "a fixed colour reads on one theme only"


def test_live_text_is_the_state_shown_and_saved_transcripts_say_where_logs_go():
    spec = make_spec(n=2)
    result = _result(2)
    result.ranks[1].state, result.ranks[1].ended_at, result.ranks[1].exitcode = "running", None, None
    c = _collector(spec, result)
    c.output(0, "stdout", b"".join(b"step %d\n" % i for i in range(10)))
    c.output(1, "stderr", b"warming up\n 50%|#####     | 5/10\r")
    live = transcript.live_text(c, hung={1: None})
    assert "rank 0: ok 1.5 s exit 0" in live and "rank 1: hung, running" in live
    assert "step 9" in live and "step 6" not in live and "stderr|  50%|#####     | 5/10" in live
    assert "removed when the kernel stops; --log-dir DIR keeps them" in live
    kept = _collector(make_spec(n=2, log_dir="/data/logs"), _result(2))
    kept.launch_finished(kept.result)
    assert "--log-dir" not in transcript.render_text(kept)
    c.launch_finished(c.result)
    assert "(removed when the kernel stops; --log-dir DIR keeps them)" in transcript.render_text(c)
