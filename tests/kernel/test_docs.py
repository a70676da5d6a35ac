"""The documentation site (docs/, built by scripts/docs.sh): built here as CI builds it, with warnings
as errors, and read back: sphinx-build in a subprocess, once per module, into a temporary folder.
The build passes ``-W --keep-going -n`` (a broken cross-reference, a missing page, a lesson that fails
to render fail it); every option string the ``%%ddp`` parser knows, and every hint, is on its built
page; every lesson has a page with its outputs and how to open it; every internal link and anchor
resolves (external links are listed in artifacts/docs-external-links.txt, not fetched); the home page,
the options reference and a lesson open in Chromium (screenshots: artifacts/docs-*.png; marked
``browser``, the build being this file's point). The pages' sources against the code, without a
build: tests/unit/test_docs_sources.py.
"""
from __future__ import annotations

import glob
import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import support

ROOT = support.ROOT
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "html"
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-b", "html", "-q",
                           str(DOCS), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    assert "WARNING" not in done.stderr, done.stderr[-6000:]
    return out


def text_of(path: Path) -> str:
    """The page's text, tags removed, entities decoded, whitespace collapsed."""
    raw = path.read_text()
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", raw)).split())


def test_every_option_of_the_parser_is_on_the_options_page(site):
    from nbddp.core import ddpline, linecommands

    page = site / "reference" / "options.html"
    text = text_of(page)
    parser = ddpline.build_parser()
    missing = [s for s in parser._option_string_actions if not re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text)]
    assert not missing, f"options the parser knows but {page.name} does not show: {missing}"
    for action in parser._actions:
        if action.help and "%" not in action.help:
            assert " ".join(action.help.split()) in text, action.help
    for word in (*linecommands.POOL_COMMANDS, "%ddp_pool", "%ddp_export", "%%ddp"):
        assert word in text, word


def test_every_hint_is_on_the_hints_page(site):
    from nbddp.core import diagnosis

    text = text_of(site / "reference" / "hints.html")
    for pattern, hint in [*diagnosis.HINTS, (None, diagnosis.PRIVATE_NET_HINT)]:
        assert " ".join(hint.split()) in text, hint
        if pattern is not None:
            assert pattern.pattern in text, pattern.pattern


def test_every_lesson_has_a_page_with_its_outputs(site):
    lessons = sorted(glob.glob(str(DOCS / "lessons" / "*.ipynb")))
    assert len(lessons) >= 16, lessons
    index = (site / "tutorials" / "index.html").read_text()
    for path in lessons:
        name = Path(path).stem
        built = site / "lessons" / f"{name}.html"
        assert built.exists(), f"no page for {name}"
        assert f"../lessons/{name}.html" in index, f"the tutorials page does not link {name}"
        page = built.read_text()
        assert f"notebooks/{name}.ipynb" in text_of(built), f"{name}: no way to open it"
        if (ROOT / "notebooks" / f"{name}.ipynb").exists():  # the notebook as learners get it, to download
            assert f'href="../notebooks/{name}.ipynb"' in page and (site / "notebooks" / f"{name}.ipynb").exists(), name
        outputs = [o for c in json.load(open(path))["cells"] for o in c.get("outputs", [])]
        if any("image/png" in o.get("data", {}) for o in outputs):
            assert "<img" in page, f"{name}: its plots are not shown"
        if any(o.get("output_type") == "stream" for o in outputs):
            assert 'class="output stream' in page or "output_stream" in page or "cell_output" in page, name


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            if attrs.get(key) and not (tag == "link" and key == "href" and attrs.get("rel") == "preload"):
                self.links.append(attrs[key])


def test_every_internal_link_resolves_and_external_ones_are_listed(site):
    parsed: dict[Path, Links] = {}

    def parse(path: Path) -> Links:
        if path not in parsed:
            parser = Links()
            parser.feed(path.read_text(errors="replace"))
            parsed[path] = parser
        return parsed[path]

    broken, external = [], set()
    pages_built = sorted(site.rglob("*.html"))
    assert len(pages_built) > 30, pages_built
    for page in pages_built:
        for link in parse(page).links:
            parts = urlsplit(link)
            if parts.scheme in ("http", "https", "mailto"):
                external.add(link)
                continue
            if parts.scheme or link.startswith("//"):
                broken.append(f"{page.relative_to(site)}: {link} (a scheme a reader's browser cannot follow here)")
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {link}")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in parse(target).ids:
                broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "docs-external-links.txt").write_text("\n".join(sorted(external)) + "\n")
    print(f"{len(external)} external links (not fetched), in artifacts/docs-external-links.txt")
    assert not broken, "\n".join(broken[:50])


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (scripts/setup-browser.sh installs it)")
def test_the_home_page_options_and_a_lesson_open_in_a_browser(site):
    from playwright.sync_api import sync_playwright

    args = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]
    ARTIFACTS.mkdir(exist_ok=True)
    shown = {
        "home": ("index.html", "Run a Jupyter cell as a real PyTorch distributed job"),
        "options": ("reference/options.html", "--nproc-per-node"),
        "lesson": ("lessons/03_p2p_and_collectives.html", "jupyter lab notebooks/03_p2p_and_collectives.ipynb"),
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            for name, (path, words) in shown.items():
                page.goto((site / path).as_uri())
                page.wait_for_load_state("load")
                assert words in " ".join(page.inner_text("article").split()), (name, words)
                if name == "home":
                    assert page.evaluate("document.querySelector('article img').naturalWidth") > 0  # the live view
                if name == "lesson":
                    images = page.evaluate("[...document.querySelectorAll('article img')].map(i => i.naturalWidth)")
                    assert images and all(w > 0 for w in images), images  # its plots drawn
                page.screenshot(path=str(ARTIFACTS / f"docs-{name}.png"), full_page=False)
            assert not errors, errors
        finally:
            browser.close()
