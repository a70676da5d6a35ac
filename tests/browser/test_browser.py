"""In a real browser: JupyterLab on 127.0.0.1 with a temporary root (tests/support/helpers.py's
jupyterlab()), Debian's Chromium driven by playwright, `%%ddp` cells run from the notebook UI: rank
tabs, status chips, flood, hang and failure; a rank's debugger prompt in Lab's input box; long
streams in the dark theme (scroll and selection kept, saved mid-run and reopened in Lab and
Notebook 7). Screenshots go to artifacts/ (one on failure too)."""
import contextlib
import json
import os
import re
import time
import urllib.request

import pytest

from support import ROOT
from support.helpers import jupyterlab

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(ROOT, "artifacts")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if not os.path.exists(CHROMIUM) and not os.environ.get("CI"):
    pytest.skip("Debian's chromium is not installed (scripts/setup-browser.sh installs it)", allow_module_level=True)

CELL = """%%ddp -n 2
import os, sys, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}")
print(f"warning from rank {rank}", file=sys.stderr)
print("\\033[32mcolour OK\\033[0m")
for i in tqdm(range(30), ascii=True, mininterval=0):
    time.sleep(0.05 + 0.03 * rank)
time.sleep(1.0 + rank)
"""
FLOOD = """%%ddp -n 2 --ranks 0
import os
if os.environ["RANK"] == "0":
    for i in range(200_000):
        print("flood line", i)
"""
MANY = """%%ddp -n 32
import os
print("rank says", os.environ["RANK"])
"""
STREAM = """%%ddp -n 2 --ranks 0
import os, time
for i in range(2400):   # until the test has looked (it writes the stop file), 2 min at most
    print(f"step {{i}} loss {{1 / (i + 1):.4f}}", flush=True)
    if i > 100 and os.path.exists({stop!r}):
        break
    time.sleep(0.05)
"""
HANG = """%%ddp -n 2 --idle-warning 1.5
import os, time
time.sleep(4 if os.environ["RANK"] == "0" else 3)
print("back", flush=True)
time.sleep(1.5)
"""
FAIL16 = """%%ddp -n 16
import os, time
if os.environ["RANK"] == "11":
    time.sleep(1); raise ValueError("rank eleven broke")
time.sleep(30)
"""
DEBUG = """%%ddp -n 2
import os
rank = int(os.environ["RANK"])
secret = 6 * 7 + rank
if rank == 1:
    breakpoint()
print(f"rank {rank} done")
"""


@pytest.fixture
def lab(tmp_path):
    stream = STREAM.format(stop=str(tmp_path / "root" / "stream.stop"))
    with jupyterlab(tmp_path, ["%load_ext nbddp", CELL, FLOOD, MANY, stream, HANG, FAIL16]) as served:
        yield served


def open_notebook(browser, base, token):
    """A page with JupyterLab's ddp.ipynb open and its kernel connected and idle."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(f"{base}/lab/tree/ddp.ipynb?token={token}", timeout=90_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=90_000)
    return page


@contextlib.contextmanager
def notebook_page(base, token, failure_png):
    """Chromium on JupyterLab's ddp.ipynb (``open_notebook``): yields (browser, page); a failure
    leaves a screenshot of the first page opened in artifacts/``failure_png``."""
    from playwright.sync_api import sync_playwright

    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser, open_notebook(browser, base, token)
        except BaseException:
            pages = [page for context in browser.contexts for page in context.pages]
            if pages:
                try:
                    pages[0].screenshot(path=os.path.join(ARTIFACTS, failure_png))
                except Exception:
                    pass
            raise
        finally:
            browser.close()


def _choose_the_kernel_if_asked(page):
    """Notebook 7 asks "Select Kernel" when Run All comes before its session has a kernel (a
    loaded machine: its status said Idle, then Connecting): take the notebook's own, as a user would."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    dialog = page.locator(".jp-Dialog")
    for attempt in range(4):  # an accept clicked before the kernel list has loaded does not close it
        if not (dialog.count() and "Select Kernel" in dialog.first.inner_text()):
            return
        dialog.first.locator(".jp-mod-accept").click()
        try:
            dialog.first.wait_for(state="detached", timeout=15_000)
            return
        except PlaywrightTimeout:
            if attempt == 3:
                raise


def run_all(page):
    """Run All Cells on an open notebook whose kernel is idle (a click that lands while Lab is
    still settling can be lost: up to three tries, until the first cell has run)."""
    from playwright.sync_api import expect

    first_prompt = page.locator(".jp-Cell").nth(0).locator(".jp-InputPrompt")
    for attempt in range(3):
        _choose_the_kernel_if_asked(page)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_text("Run All Cells", exact=True).click()
        try:
            expect(first_prompt).to_contain_text("[1]", timeout=20_000)
            return
        except AssertionError:
            if attempt == 2:
                raise


def test_ddp_cell_in_jupyterlab_shows_rank_tabs_and_chips(lab):
    from playwright.sync_api import expect

    base, token, tmp_path = lab
    shot = os.path.join(ARTIFACTS, "browser-ddp-2-ranks.png")
    with notebook_page(base, token, "browser-ddp-failure.png") as (browser, page):
        run_all(page)
        view = page.locator(".nbddp-view").nth(0)
        expect(view).to_be_visible(timeout=60_000)
        status = page.locator(".jp-Cell").nth(1).locator(".nbddp-status")
        # live: while the cell runs, rank 1 (which sleeps longer) shows as running, and the
        # tqdm bar (a line without newline) is in the pane and on the chip, updating
        expect(status).to_contain_text("rank 1: running", timeout=30_000)
        pane = view.locator(".nbddp-pane:visible")
        expect(pane).to_contain_text("/30 [", timeout=30_000)
        first_bar = status.locator(".nbddp-chip").nth(1).inner_text()
        expect(status.locator(".nbddp-progress").first).to_be_visible()
        # a bar's spaces are kept on its chip
        kept = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea").evaluate(   # re-drawn 2×/s: looked up at once
            "e => { const s = getComputedStyle(e.querySelector('.nbddp-progress')); "
            "return [s.whiteSpaceCollapse, s.whiteSpace]; }")
        assert "preserve" in kept or "pre" in kept, kept
        # the ANSI colour is rendered as colour, not as escape characters
        green = pane.locator("span", has_text="colour OK").first
        assert green.evaluate("e => getComputedStyle(e).color") == "rgb(13, 188, 121)"
        assert "\x1b" not in pane.inner_text() and "[32m" not in pane.inner_text()
        page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea").screenshot(path=shot)
        page.wait_for_timeout(600)
        assert status.locator(".nbddp-chip").nth(1).inner_text() != first_bar   # the bar moved
        tabs = view.locator(".lm-TabBar-tab")
        expect(tabs).to_have_count(3)
        assert [t.strip() for t in tabs.all_inner_texts()] == ["rank 0", "rank 1", "all ranks"]
        expect(pane.locator(".nbddp-stderr").first).to_contain_text("warning from rank 0")
        # the durable output: when the launch ends the widgets give way to the transcript
        out = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
        done = out.locator(".nbddp-transcript")
        expect(done).to_contain_text("all ok", timeout=60_000)
        expect(out.locator(".nbddp-view")).to_have_count(0)
        expect(done.locator(".nbddp-chip.nbddp-ok")).to_have_count(2)
        text = done.text_content()   # rank 1's section is folded: the first rank's is open
        assert "hello from rank 1 of 2" in text and "warning from rank 0" in text
        bars = [line for line in text.splitlines() if "/30 [" in line and not line.startswith("rank ")]
        assert len(bars) == 2 and all("100%" in b and "30/30" in b for b in bars), bars
        assert done.locator("pre").first.evaluate("e => getComputedStyle(e).fontFamily").startswith("monospace")
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-page.png"))

        # a flood: bounded tail with the marker, and the page stays responsive
        flood = page.locator(".jp-Cell").nth(2).locator(".jp-OutputArea")
        expect(flood.locator(".nbddp-transcript")).to_contain_text("all ok", timeout=120_000)
        t = time.monotonic()
        page.evaluate("1 + 1")
        respond_s = time.monotonic() - t
        expect(flood).to_contain_text("flood line 199999")
        expect(flood).to_contain_text("199800 earlier lines hidden")
        flood.scroll_into_view_if_needed()
        flood.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-flood.png"))

        # 32 ranks: a dropdown, not a tab strip
        many = page.locator(".jp-Cell").nth(3).locator(".jp-OutputArea")
        expect(many.locator(".nbddp-chip.nbddp-ok")).to_have_count(32, timeout=120_000)
        expect(many).to_contain_text("rank says 31")
        many.scroll_into_view_if_needed()
        many.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-32-ranks.png"))
        print(f"browser: the page answered in {respond_s:.2f} s after the flood")

        # streaming: scrolled up and a selected line both survive 3 s of new lines
        live = page.locator(".jp-Cell").nth(4).locator(".nbddp-view")
        expect(live).to_contain_text("step 70 ", timeout=120_000)
        live.scroll_into_view_if_needed()
        scroller = live.locator(".nbddp-pane:visible").first
        scroller.evaluate("e => { e.scrollTop = -(e.scrollHeight - e.clientHeight) / 2 }")   # half way up
        page.wait_for_timeout(300)
        picked, y0 = scroller.evaluate(TOP_LINE)   # selects the line at the top of the view
        assert picked.startswith("step "), picked
        page.wait_for_timeout(3000)
        still, y1, bottom_gap = scroller.evaluate(WHERE)
        assert still == picked and abs(y1 - y0) < 3 and bottom_gap > 200, (picked, y0, still, y1, bottom_gap)
        live.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-scrolled.png"))
        # back at the bottom, the pane follows the newest line again
        scroller.evaluate("e => { e.scrollTop = 0 }")
        page.wait_for_timeout(1000)
        assert abs(scroller.evaluate("e => e.scrollTop")) < 5
        (tmp_path / "root" / "stream.stop").write_text("")   # the stream cell may end now

        # a hang: banner and amber chips while no rank writes, cleared when output resumes
        hang = page.locator(".jp-Cell").nth(5).locator(".jp-OutputArea")
        expect(hang.locator(".nbddp-hang")).to_contain_text("blocked at", timeout=120_000)
        expect(hang.locator(".nbddp-chip.nbddp-hung")).to_have_count(2)
        spacing = hang.evaluate(   # the status is re-drawn 2×/s: looked up at once
            """e => { const s = getComputedStyle(e.querySelector('.nbddp-hang'));
                      return parseFloat(s.lineHeight) / parseFloat(s.fontSize); }""")
        assert spacing < 1.6, spacing   # the banner's lines are not spaced apart
        hang.scroll_into_view_if_needed()
        hang.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-hang.png"))
        expect(hang.locator(".nbddp-hang")).to_have_count(0, timeout=30_000)

        # 16 ranks, one fails: its section is the open one, the rest said in one line
        fail = page.locator(".jp-Cell").nth(6).locator(".jp-OutputArea")
        done = fail.locator(".nbddp-transcript")
        expect(done).to_contain_text("rank 11: failed", timeout=120_000)
        summary = "ranks 0–10,12–15: terminated (stopped by nbddp after rank 11 failed)"
        assert done.inner_text().count(summary) == 1, done.inner_text()[:2000]
        assert "exit -15" not in done.inner_text() and "stopped (SIGTERM)" in done.inner_text()
        assert done.locator(".nbddp-chip").count() == 2     # the failed rank, and one for the 15 others
        opened = done.locator("details[open] > summary")
        expect(opened).to_have_count(1)
        expect(opened).to_contain_text("rank 11")
        expect(fail).to_contain_text("DDPError")
        fail.scroll_into_view_if_needed()
        fail.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-16-failure.png"))
        # saved, kernel restarted, page reloaded: the outputs are the transcript, no widget error
        page.keyboard.press("Control+s")
        page.wait_for_timeout(1500)
        page.get_by_role("menuitem", name="Kernel", exact=True).click()
        page.get_by_text("Restart Kernel…", exact=True).click()
        page.get_by_role("button", name="Confirm Kernel Restart").click()
        page.wait_for_timeout(1500)
        page.reload()
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        expect(page.locator(".nbddp-transcript")).to_have_count(6, timeout=60_000)
        assert "model not found" not in page.locator(".jp-Notebook").inner_text()
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-reloaded.png"))
    assert os.path.getsize(shot) > 5000


def test_a_ranks_debugger_prompt_is_in_jupyterlabs_input_box_and_the_answer_reaches_it(tmp_path):
    """breakpoint() on rank 1: JupyterLab's stdin box shows "(Pdb rank 1)", the header names the
    rank in the debugger, and what is typed there runs in rank 1 (`p secret * 1000` → 43000)."""
    from playwright.sync_api import expect

    with jupyterlab(tmp_path, ["%load_ext nbddp", DEBUG]) as (base, token, _), \
            notebook_page(base, token, "browser-debugger-failure.png") as (browser, page):
        run_all(page)
        box = page.locator(".jp-Stdin-input")
        expect(box).to_be_visible(timeout=90_000)
        expect(page.locator(".jp-Stdin-prompt").last).to_contain_text("(Pdb rank 1)")
        expect(page.locator(".nbddp-asking")).to_contain_text("rank 1 is in the debugger", timeout=30_000)
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-debugger-prompt.png"))
        prompts = page.locator(".jp-Stdin-prompt")
        asked = prompts.count()
        box.fill("p secret * 1000")
        box.press("Enter")
        expect(prompts).not_to_have_count(asked, timeout=30_000)   # the next prompt, after the answer ran
        expect(prompts.last).to_contain_text("(Pdb rank 1)")
        # rank 1's pane is in front while it is in the debugger: its listing and the value
        expect(page.locator(".nbddp-pane:visible")).to_contain_text("43000", timeout=30_000)
        box = page.locator(".jp-Stdin-input").last
        box.fill("c")
        box.press("Enter")
        output = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
        expect(output).to_contain_text("2 ranks, all ok", timeout=60_000)
        expect(output).to_contain_text("43000")
        expect(output).to_contain_text("rank 1 done")


LONG_STREAM = """%%ddp -n 2
import os, time
rank = int(os.environ["RANK"])
rate, n, word = (50, 2000, "fast") if rank == 0 else (4, 280, "slow")
start = time.monotonic()
for i in range(n):
    print(f"{word} {i} loss {1 / (i + 1):.4f}", flush=True)
    time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
"""
FAIL2 = """%%ddp -n 2
import os, sys
print("about to fail", os.environ["RANK"], file=sys.stderr, flush=True)
if os.environ["RANK"] == "1":
    raise ValueError("rank one broke")
"""
# the line at the top of a pane's viewport and its offset from the pane's top
TOP_LINE = """e => { const r = e.getBoundingClientRect();
    const c = document.caretRangeFromPoint(r.left + 30, r.top + 8);
    const t = c.startContainer.textContent, o = c.startOffset;
    const a = t.lastIndexOf('\\n', o - 1) + 1; let b = t.indexOf('\\n', o); if (b < 0) b = t.length;
    const line = document.createRange(); line.setStart(c.startContainer, a); line.setEnd(c.startContainer, b);
    const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(line);
    return [t.slice(a, b), line.getBoundingClientRect().top - r.top]; }"""
WHERE = """e => { const r = e.getBoundingClientRect(), line = window.getSelection().getRangeAt(0);
    return [window.getSelection().toString(), line.getBoundingClientRect().top - r.top, -e.scrollTop]; }"""
# WCAG contrast of an element's text on what is painted under it (backgrounds composited)
CONTRAST = """e => { const cv = document.createElement('canvas'); cv.width = cv.height = 1;
    const ctx = cv.getContext('2d'), paint = c => { ctx.fillStyle = c; ctx.fillRect(0, 0, 1, 1); },
          px = () => Array.from(ctx.getImageData(0, 0, 1, 1).data.slice(0, 3));
    const chain = []; for (let n = e; n; n = n.parentElement) chain.unshift(n);
    paint('white'); for (const n of chain) paint(getComputedStyle(n).backgroundColor);
    const bg = px(); paint(getComputedStyle(e).color); const fg = px();
    const lum = c => c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
                      .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
    const [hi, lo] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    return [(hi + 0.05) / (lo + 0.05), lum(bg)]; }"""


def _saved_copy(path, saved_at, deadline_s=30):
    """The notebook as the server saved it after ``saved_at``: the server writes the file in
    place (truncate, then write), so a read the moment its mtime moves can see it empty or half
    written; wait until it parses as a whole notebook."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if os.path.getmtime(path) != saved_at:
            text = path.read_text()
            try:
                json.loads(text)
                return text
            except ValueError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"{path} was not saved as a whole notebook within {deadline_s} s")


@pytest.fixture
def dark_lab(tmp_path):
    with jupyterlab(tmp_path, ["%load_ext nbddp", LONG_STREAM, FAIL2], theme="JupyterLab Dark") as served:
        yield served


def test_panes_keep_scroll_and_selection_and_the_end_reads_in_dark_theme(dark_lab):
    """2,000 lines at 50 lines/s (rank 0) and 280 at 4 lines/s (rank 1): scrolled up, the line in view
    and a selection stay while the pane wraps its blocks; saved mid-run, the notebook reads as
    the last state shown; the transcript is about as tall as the live view; dark theme contrast."""
    from playwright.sync_api import expect

    base, token, tmp_path = dark_lab
    root = tmp_path / "root"
    with notebook_page(base, token, "browser-ddp-stream-failure.png") as (browser, page):
        assert page.evaluate("document.body.dataset.jpThemeLight") == "false"
        run_all(page)
        out = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
        view = out.locator(".nbddp-view")
        pane = view.locator(".nbddp-pane:visible")
        # 50 lines/s: well past one wrap of the pane's blocks (and the old 750-line compaction)
        expect(pane).to_contain_text("fast 800 ", timeout=120_000)
        out.scroll_into_view_if_needed()
        pane.evaluate("e => { e.scrollTop = -1600 }")   # ~100 lines up from the newest
        page.wait_for_timeout(300)
        line0, y0 = pane.evaluate(TOP_LINE)
        assert line0.startswith("fast "), line0
        page.wait_for_timeout(6000)   # 300 more lines; the old panes were refilled every 250
        picked, y1, gap = pane.evaluate(WHERE)
        assert picked == line0 and abs(y1 - y0) < 3 and gap > 1600, (line0, y0, picked, y1, gap)
        view.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-fast-scrolled.png"))

        # 4 lines/s: scrolled to the top, past the 120 updates after which the old panes refilled
        view.locator(".lm-TabBar-tab", has_text="rank 1").click()
        expect(pane).to_contain_text("slow 80 ", timeout=60_000)
        pane.evaluate("e => { e.scrollTop = -(e.scrollHeight - e.clientHeight) + 40 }")
        page.wait_for_timeout(300)
        line0, y0 = pane.evaluate(TOP_LINE)
        assert line0.startswith("slow "), line0
        # saved while the cell runs: a copy to reopen once the kernel that drew it is gone
        saved_at = os.path.getmtime(root / "ddp.ipynb")
        page.keyboard.press("Control+s")
        (root / "saved-running.ipynb").write_text(_saved_copy(root / "ddp.ipynb", saved_at))
        # past the 120 updates after which the old panes refilled (a line is one update at 4 a second)
        newest = max(int(n) for n in re.findall(r"slow (\d+) ", pane.inner_text()))
        expect(pane).to_contain_text(f"slow {min(newest + 125, 279)} ", timeout=90_000)
        picked, y1, _ = pane.evaluate(WHERE)
        assert picked == line0 and abs(y1 - y0) < 3, (line0, y0, picked, y1)
        live_height = out.bounding_box()["height"]

        # the end: a transcript about as tall as the live view, rank 0 open, rank 1 folded
        done = out.locator(".nbddp-transcript")
        expect(done).to_contain_text("all ok", timeout=120_000)
        page.wait_for_timeout(500)
        done_height = out.bounding_box()["height"]
        assert done_height < 1.5 * live_height, (live_height, done_height)
        expect(done.locator("details[open] > summary")).to_have_count(1)
        expect(done.locator("details[open] > summary")).to_contain_text("rank 0")
        section = done.locator("details[open] .nbddp-section")
        assert section.evaluate("e => e.scrollHeight > e.clientHeight + 100")   # scrolls, its end in view
        expect(section).to_contain_text("fast 1999 ")
        assert "--log-dir DIR keeps them" in done.inner_text()
        copied = done.locator(".nbddp-chip").first.evaluate("""e => { const r = document.createRange();
            r.selectNodeContents(e.parentNode); const s = getSelection(); s.removeAllRanges(); s.addRange(r);
            return s.toString(); }""")
        assert "exit 0 · rank 1: ok" in copied, copied
        out.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-stream-done.png"))
        print(f"browser: live view {live_height:.0f} px, transcript {done_height:.0f} px")

        # dark theme: stderr lines and the cause read (>= 4.5:1) on a dark strip
        fail = page.locator(".jp-Cell").nth(2).locator(".jp-OutputArea")
        expect(fail).to_contain_text("DDPError", timeout=120_000)
        fail.scroll_into_view_if_needed()
        cause_contrast, _ = fail.locator(".nbddp-cause").first.evaluate(CONTRAST)
        stderr_line = fail.locator("details[open] .nbddp-stderr", has_text="about to fail 1")
        stderr_contrast, stderr_bg = stderr_line.evaluate(CONTRAST)
        print(f"browser, dark theme: cause {cause_contrast:.1f}:1, stderr {stderr_contrast:.1f}:1")
        assert cause_contrast >= 4.5 and stderr_contrast >= 4.5 and stderr_bg < 0.2, \
            (cause_contrast, stderr_contrast, stderr_bg)
        fail.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-dark-failure.png"))

        # the copy saved mid-run, reopened (its kernel's widgets long gone), in Lab and Notebook 7
        saved = json.loads((root / "saved-running.ipynb").read_text())
        texts = ["".join(o["data"].get("text/plain", "")) for o in saved["cells"][1]["outputs"] if "data" in o]
        assert any("rank 1: running" in t and "slow " in t for t in texts), texts
        fronts = [("lab", f"{base}/lab/workspaces/reopen/tree/saved-running.ipynb?reset&token={token}")]
        if _has_notebook7(base, token):
            fronts.append(("notebook7", f"{base}/notebooks/saved-running.ipynb?token={token}"))
        for name, url in fronts:
            again = browser.new_page(viewport={"width": 1200, "height": 900})
            again.goto(url, timeout=90_000)
            status = again.locator(".jp-NotebookPanel:visible .nbddp-status")
            try:
                expect(status).to_contain_text("rank 1: running", timeout=90_000)
                expect(status.locator(".nbddp-chip")).to_have_count(2)
                status.scroll_into_view_if_needed()
                expect(status).to_be_visible()
                # the live view's output, its model gone with the kernel: one line says so instead
                orphan = again.locator(".jp-NotebookPanel:visible .jp-OutputArea-output", has_text="model not found")
                expect(orphan).to_have_count(1, timeout=60_000)
                print("orphaned view:", orphan.evaluate("e => e.outerHTML")[:300])
                before, size = orphan.evaluate(
                    "e => [getComputedStyle(e, '::before').content, getComputedStyle(e).fontSize]")
                assert "the kernel that ran this cell is gone" in before and size == "0px", (before, size)
            finally:
                again.screenshot(path=os.path.join(ARTIFACTS, f"browser-ddp-saved-running-{name}.png"))
                again.close()


def _has_notebook7(base, token) -> bool:
    try:
        urllib.request.urlopen(f"{base}/tree?token={token}", timeout=10).read()
        return True
    except Exception:
        return False


NB7_STREAM = """%%ddp -n 2
import os, time
for i in range(60):
    print(f"line {i} of rank {os.environ['RANK']}", flush=True)
    time.sleep(0.1)
"""


def test_a_ddp_cell_streams_into_notebook_7s_live_view_and_ends_in_a_transcript(tmp_path):
    """Notebook 7 (its own page, JupyterLab's components): the live view's panes fill while the
    ranks print, the rank tabs switch panes, and the cell ends in the transcript."""
    from playwright.sync_api import expect, sync_playwright

    with jupyterlab(tmp_path, ["%load_ext nbddp", NB7_STREAM]) as (base, token, _):
        assert _has_notebook7(base, token), "Notebook 7 is part of the test extras"
        os.makedirs(ARTIFACTS, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            try:
                page.goto(f"{base}/notebooks/ddp.ipynb?token={token}", timeout=90_000)
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
                # idle first: Run All before the session has its kernel opens "Select Kernel" (ci, loaded)
                expect(page.locator(".jp-Notebook-ExecutionIndicator")).to_contain_text("Idle", timeout=90_000)
                run_all(page)
                out = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
                view = out.locator(".nbddp-view")
                expect(view.locator(".nbddp-pane:visible")).to_contain_text("line 10 of rank", timeout=120_000)
                assert out.locator(".nbddp-transcript").count() == 0   # still live
                view.locator(".lm-TabBar-tab", has_text="rank 1").click()
                expect(view.locator(".nbddp-pane:visible")).to_contain_text("of rank 1", timeout=30_000)
                page.screenshot(path=os.path.join(ARTIFACTS, "browser-notebook7-live.png"))
                done = out.locator(".nbddp-transcript")
                expect(done).to_contain_text("all ok", timeout=120_000)
                expect(done).to_contain_text("line 59 of rank 0")
                page.screenshot(path=os.path.join(ARTIFACTS, "browser-notebook7-done.png"))
                # run again by hand, long after the probe went out: the kernel now judges this page
                # by its widget manager's answer (it drew the probe's jslink), so still the live view
                page.locator(".jp-Cell").nth(1).locator(".jp-InputArea-editor").click()
                page.keyboard.press("Shift+Enter")
                expect(out.locator(".nbddp-view .nbddp-pane:visible")).to_contain_text("line 10 of rank",
                                                                                     timeout=120_000)
                expect(done).to_contain_text("all ok", timeout=120_000)
                assert "did not draw" not in out.inner_text()
            except BaseException:
                page.screenshot(path=os.path.join(ARTIFACTS, "browser-notebook7-failure.png"))
                raise
            finally:
                browser.close()
