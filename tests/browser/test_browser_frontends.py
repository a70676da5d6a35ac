"""In a real browser: a JupyterLab whose server lacks the widgets front end (the
`@jupyter-widgets/jupyterlab-manager` extension turned off, as on a server without
`jupyterlab_widgets`). `--output auto` must show text there, with the line saying why and how to
get widgets, and `--output widgets` must say it cannot instead of showing nothing."""
import os

from test_browser import ARTIFACTS, notebook_page

from support.helpers import jupyterlab

AUTO = "%%ddp -n 2\nimport os\nprint('auto says hello from', os.environ['RANK'])"
WIDGETS = "%%ddp -n 2 --output widgets\nimport os\nprint('asked widgets, rank', os.environ['RANK'])"


def test_jupyterlab_without_the_widgets_front_end_gets_text_saying_why(tmp_path):
    from playwright.sync_api import expect

    with jupyterlab(tmp_path, ["%load_ext nbddp", AUTO, WIDGETS],
                    disabled_extensions=["@jupyter-widgets/jupyterlab-manager"]) as (base, token, _), \
            notebook_page(base, token, "browser-no-widgets-frontend-failure.png") as (_, page):
        cells = page.locator(".jp-Cell")
        for i in range(3):  # one at a time, as a person would (a "Run all" races the probe)
            cells.nth(i).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            expect(cells.nth(i).locator(".jp-InputPrompt")).to_contain_text(f"[{i + 1}]", timeout=180_000)
        auto = cells.nth(1).locator(".jp-OutputArea")
        expect(auto).to_contain_text("[rank1]:auto says hello from 1", timeout=60_000)
        expect(auto).to_contain_text("this front end cannot render ipywidgets")
        expect(auto).to_contain_text("jupyterlab_widgets")
        asked = cells.nth(2).locator(".jp-OutputArea")
        expect(asked).to_contain_text("--output widgets cannot show here", timeout=60_000)
        expect(asked).to_contain_text("[rank0]:asked widgets, rank 0")
        text = page.locator(".jp-Notebook").inner_text()
        assert "live view: ipywidgets" not in text and "model not found" not in text.lower()
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-no-widgets-frontend.png"))
