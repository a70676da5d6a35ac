"""The README as a page: short, pointing to the docs, linking only files that exist, and every fenced
``bash`` block of it either run by tests/kernel/test_readme.py or named with the reason it cannot
run on a test machine (support/readme.py), so a block the README gains fails here at once."""
import os
import re

from support import ROOT
from support.readme import BLOCKS, README, command_and_comment, readme_blocks


def test_every_readme_command_block_is_run_here_or_says_why_not():
    blocks = readme_blocks()
    assert len(blocks) >= 4, blocks
    unplanned = [block[0] for block in blocks if command_and_comment(block[0])[0] not in BLOCKS]
    assert not unplanned, f"README blocks this test does not know (run them or say why not): {unplanned}"
    stale = set(BLOCKS) - {command_and_comment(block[0])[0] for block in blocks}
    assert not stale, f"blocks no longer in the README: {stale}"


def test_the_readme_is_short_and_points_to_the_docs():
    """A user's page: at most 150 lines of at most 200 characters, the sections a newcomer looks for;
    the rest lives in the docs site (docs/), which it names with the command that builds it."""
    with open(README) as f:
        text = f.read()
    lines = text.splitlines()
    assert len(lines) <= 150, len(lines)
    assert not [n for n, line in enumerate(lines, 1) if len(line) > 200]
    sections = re.findall(r"^## (.+)$", text, re.M)
    for needed in ("Two commands", "One cell", "Install", "Lessons", "Documentation", "Architecture"):
        assert needed in sections, (needed, sections)
    assert "docs/live-view.png" in text and "bash scripts/docs.sh" in text and "docs/_build/html/index.html" in text
    assert "MIT" in text and "CHANGELOG.md" in text
    assert "tests/" not in text, "test files are contributor material: docs/explanation/contributing.md"
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), f"the README links a missing file: {target}"


def test_command_and_comment_split():
    assert command_and_comment('pip install -e ".[lessons]"   # from a checkout: x') == (
        'pip install -e ".[lessons]"', "from a checkout: x")
    assert command_and_comment("bash scripts/demo.sh") == ("bash scripts/demo.sh", "")
    assert command_and_comment("bash scripts/demo.sh     # the %%ddp demo") == \
        ("bash scripts/demo.sh", "the %%ddp demo")
