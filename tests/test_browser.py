"""In a real browser: JupyterLab on 127.0.0.1 with a temporary root, Debian's Chromium driven by
playwright, a `%%ddp -n 2` cell run from the notebook UI; both ranks' tabs and status chips must
show the expected text. Saves a screenshot to artifacts/."""
import json
import os
import time

import pytest

from helpers import jupyter_server

pytestmark = pytest.mark.kernel  # see tests/conftest.py

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "artifacts")
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
import time
for i in range(180):
    print(f"step {i} loss {1 / (i + 1):.4f}", flush=True)
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
    root = tmp_path / "root"
    root.mkdir()
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                     "outputs": [], "source": src} for i, src in enumerate(["%load_ext nbddp", CELL, FLOOD, MANY, STREAM, HANG, FAIL16])],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / "ddp.ipynb").write_text(json.dumps(nb))
    debug = dict(nb, cells=[dict(nb["cells"][0], id="d0"), dict(nb["cells"][0], id="d1", source=DEBUG)])
    (root / "debug.ipynb").write_text(json.dumps(debug))
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"))
    env.pop("NBDDP_OUTPUT", None)
    with jupyter_server("jupyterlab", root, env, tmp_path / "lab.log", "--LabApp.news_url=") as (base, token):
        yield base, token, tmp_path


def open_notebook(browser, base, token):
    """A page with JupyterLab's ddp.ipynb open and its kernel connected and idle."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(f"{base}/lab/tree/ddp.ipynb?token={token}", timeout=90_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=90_000)
    return page


def run_all(browser, url):
    """A page with the notebook at ``url`` open, its kernel idle, and Run All Cells clicked."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(url, timeout=90_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    # the kernel is connected and idle before anything runs
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=90_000)
    first_prompt = page.locator(".jp-Cell").nth(0).locator(".jp-InputPrompt")
    for attempt in range(3):  # a click that lands while Lab is still settling can be lost
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_text("Run All Cells", exact=True).click()
        try:
            expect(first_prompt).to_contain_text("[1]", timeout=20_000)
            return page
        except AssertionError:
            if attempt == 2:
                raise


def test_ddp_cell_in_jupyterlab_shows_rank_tabs_and_chips(lab):
    from playwright.sync_api import expect, sync_playwright

    base, token, tmp_path = lab
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "browser-ddp-2-ranks.png")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = run_all(browser, f"{base}/lab/tree/ddp.ipynb?token={token}")
            view = page.locator(".nbddp-view").nth(0)
            expect(view).to_be_visible(timeout=60_000)
            # live: while the cell runs, rank 1 (which sleeps longer) shows as running, and the
            # tqdm bar (a line without newline) is in the pane and on the chip, updating
            expect(view).to_contain_text("rank 1: running", timeout=30_000)
            pane = view.locator(".nbddp-pane:visible")
            expect(pane).to_contain_text("/30 [", timeout=30_000)
            first_bar = view.locator(".nbddp-chip").nth(1).inner_text()
            expect(view.locator(".nbddp-progress").first).to_be_visible()
            # the ANSI colour is rendered as colour, not as escape characters
            green = pane.locator("span", has_text="colour OK").first
            assert green.evaluate("e => getComputedStyle(e).color") == "rgb(13, 188, 121)"
            assert "\x1b" not in pane.inner_text() and "[32m" not in pane.inner_text()
            view.screenshot(path=shot)
            page.wait_for_timeout(600)
            assert view.locator(".nbddp-chip").nth(1).inner_text() != first_bar   # the bar moved
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
            text = done.inner_text()
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
            from_top = "e => e.scrollHeight - e.clientHeight + e.scrollTop"   # column-reverse: scrollTop <= 0
            scroller.evaluate("e => { e.scrollTop = -(e.scrollHeight - e.clientHeight) + 40 }")   # near the top
            page.wait_for_timeout(300)
            top0 = scroller.evaluate(from_top)
            picked = scroller.evaluate("""e => {
                const pre = e.querySelector('.nbddp-block pre');
                const range = document.createRange(); range.selectNodeContents(pre.firstChild || pre);
                const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range);
                return sel.toString(); }""")
            assert "step 0 loss 1.0000" in picked, picked
            page.wait_for_timeout(3000)
            assert page.evaluate("window.getSelection().toString()") == picked
            top1, bottom_gap = scroller.evaluate("e => [e.scrollHeight - e.clientHeight + e.scrollTop, -e.scrollTop]")
            assert abs(top1 - top0) < 5 and bottom_gap > 200, (top0, top1, bottom_gap)
            live.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-scrolled.png"))
            # back at the bottom, the pane follows the newest line again
            scroller.evaluate("e => { e.scrollTop = 0 }")
            page.wait_for_timeout(1000)
            assert abs(scroller.evaluate("e => e.scrollTop")) < 5

            # a hang: banner and amber chips while no rank writes, cleared when output resumes
            hang = page.locator(".jp-Cell").nth(5).locator(".jp-OutputArea")
            expect(hang.locator(".nbddp-hang")).to_contain_text("blocked at", timeout=120_000)
            expect(hang.locator(".nbddp-chip.nbddp-hung")).to_have_count(2)
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
        except Exception:
            try:
                page.screenshot(path=os.path.join(ARTIFACTS, "browser-ddp-failure.png"))
            except Exception:
                pass
            raise
        finally:
            browser.close()
    assert os.path.getsize(shot) > 5000


def test_a_ranks_debugger_prompt_is_in_jupyterlabs_input_box_and_the_answer_reaches_it(lab):
    """breakpoint() on rank 1: JupyterLab's stdin box shows "(Pdb rank 1)", the header names the
    rank in the debugger, and what is typed there runs in rank 1 (`p secret * 1000` → 43000)."""
    from playwright.sync_api import expect, sync_playwright

    base, token, _ = lab
    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = run_all(browser, f"{base}/lab/tree/debug.ipynb?token={token}")
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
        finally:
            browser.close()
