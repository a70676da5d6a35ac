"""The documentation's sources against the code, without a build: the environment table names every
``NBDDP_*`` variable the code reads; the architecture page names every module; the generated
tables' sources cover the parser and the hints; the pages' lines (the README's and the
changelog's too) fit 200 characters; the changelog is in Keep a Changelog's shape; scripts/docs.sh
builds as tests/kernel/test_docs.py does.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import support

ROOT = support.ROOT
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))


def pages() -> list[Path]:
    """The site's own pages (the executed lessons are notebooks, checked by tests/kernel/test_notebooks.py)."""
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def test_every_nbddp_variable_is_in_the_environment_table():
    used = set()
    for folder in ("nbddp", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh") and path.is_file():
                used |= set(re.findall(r"\bNBDDP_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    table = (DOCS / "reference" / "environment.md").read_text()
    missing = sorted(name for name in used if f"`{name}`" not in table)
    assert not missing, f"NBDDP_* variables the code reads but docs/reference/environment.md does not list: {missing}"


def test_the_architecture_page_names_every_module():
    page = (DOCS / "explanation" / "architecture.md").read_text()
    tree = page[page.index("## The modules"):page.index("## Beside the package")]
    missing = []
    for path in sorted((ROOT / "nbddp").rglob("*.py")):
        if path.name != "__init__.py" and not re.search(rf"(^|\s){re.escape(path.name)}(\s|$)", tree, re.M):
            missing.append(str(path.relative_to(ROOT)))
    for folder in sorted(p for p in (ROOT / "nbddp").iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        if f"{folder.name}/" not in tree:
            missing.append(f"{folder.relative_to(ROOT)}/")
    assert not missing, f"modules docs/explanation/architecture.md does not place: {missing}"


def test_the_options_table_is_made_from_every_option_of_the_parser():
    import nbddp_docs
    from nbddp.core.ddpline import build_parser

    parser = build_parser()
    rows = nbddp_docs.option_rows(parser)
    listed = {s for row in rows for s in row["strings"]}
    assert listed == set(parser._option_string_actions), set(parser._option_string_actions) ^ listed
    assert all(row["help"] for row in rows), [row["strings"] for row in rows if not row["help"]]
    assert not [row for row in rows if "%%" in row["help"] or "%(" in row["help"]], "help text left unformatted"


def test_each_hint_example_triggers_its_hint():
    import nbddp_docs
    from nbddp.core import diagnosis

    patterns = {pattern.pattern: (pattern, hint) for pattern, hint in diagnosis.HINTS}
    examples = nbddp_docs.EXAMPLES
    assert set(examples) == set(patterns), ("every hint has an error text that triggers it, and only hints do",
                                            set(examples) ^ set(patterns))
    for key, text in examples.items():
        pattern, hint = patterns[key]
        assert pattern.search(text), (key, text)
        assert diagnosis.hint_for(text) == hint, f"{text!r} gets an earlier hint than its own"


def test_lines_fit_200_characters():
    long = [f"{p.relative_to(ROOT)}:{n}" for p in [*pages(), ROOT / "README.md", ROOT / "CHANGELOG.md"]
            for n, line in enumerate(p.read_text().splitlines(), 1) if len(line) > 200]
    assert not long, long


def test_the_changelog_is_in_keep_a_changelog_shape():
    import nbddp

    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert versions[0] == "Unreleased" and nbddp.__version__ in versions, versions
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        kinds = re.findall(r"^### (\w+)", block, re.M)
        assert set(kinds) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
        bullets = re.findall(r"^- .*(?:\n  .*)*", block, re.M)
        too_long = [b[:60] for b in bullets if len(b) > 400]
        assert not too_long, f"bullets a user cannot read at a glance (over 400 characters): {too_long}"


def test_the_docs_command_builds_as_this_test_does():
    """scripts/docs.sh (the README's and the contributing page's one command) with the same checks."""
    script = (ROOT / "scripts" / "docs.sh").read_text()
    assert "-m sphinx -W --keep-going -n -b html" in script and "docs/_build/html" in script
    assert "docs/_build/" in (ROOT / ".gitignore").read_text().splitlines()
