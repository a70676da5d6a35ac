"""One settings module (nbddp/core/settings.py): every user-facing NBDDP_* variable is read there,
by one parser, and docs/reference/environment.md says what its table says; the variables nbddp
sets for its own processes are marked internal (a leading ``_``) so nobody takes them for
settings."""
from __future__ import annotations

import pathlib
import re

import pytest

import nbddp
from nbddp.core import settings
from nbddp.rank import cellsource, torchrun_rank

ROOT = pathlib.Path(nbddp.__file__).parent
DOC = ROOT.parent / "docs" / "reference" / "environment.md"


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_the_docs_table_is_the_settings_table():
    assert _flat(settings.list_table_rows()) in _flat(DOC.read_text())


def test_every_nbddp_variable_the_package_names_is_a_setting_or_internal():
    named = {m for path in ROOT.rglob("*.py") for m in re.findall(r"(?<![A-Z_])_?NBDDP_[A-Z_]+", path.read_text())}
    known = {s.name for s in settings.SETTINGS} | set(settings.INTERNAL)
    assert named - known == set()
    documented = set(re.findall(r"`(_?NBDDP_[A-Z_]+)`", DOC.read_text()))
    assert known <= documented


def test_only_the_settings_module_reads_them():
    readers = sorted(str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py")
                     if re.search(r"environ(\.get\(|\[)\s*[\"']NBDDP_", path.read_text()))
    assert readers == []


def test_internal_variables_are_marked_and_are_the_ones_nbddp_sets():
    assert all(name.startswith("_NBDDP_") for name in settings.INTERNAL)
    assert set(settings.INTERNAL) == {torchrun_rank.STATUS_DIR_VAR, torchrun_rank.LABEL_VAR,
                                      torchrun_rank.LEGACY_VAR, cellsource.SOURCE_VAR, torchrun_rank.THEME_VAR}


@pytest.mark.parametrize("setting, given, read", [
    (settings.OUTPUT, None, ""), (settings.OUTPUT, " Text ", "text"), (settings.OUTPUT, "tty", ""),
    (settings.SAME_LINES, None, "merge"), (settings.SAME_LINES, "APART", "apart"), (settings.SAME_LINES, "x", "merge"),
    (settings.PRIVATE_NET, None, "auto"), (settings.PRIVATE_NET, "1", "1"), (settings.PRIVATE_NET, "yes", "auto"),
    (settings.PRELOAD, None, True), (settings.PRELOAD, "Off", False), (settings.PRELOAD, "no", False),
    (settings.PRELOAD, "2", True),
    (settings.SPARES, None, 8), (settings.SPARES, "3", 3), (settings.SPARES, "-2", 0), (settings.SPARES, "many", 8),
    (settings.LOG_RANK_MB, None, 100.0), (settings.LOG_RANK_MB, "0.5", 0.5), (settings.LOG_RANK_MB, "inf", 100.0),
    (settings.LOG_TOTAL_MB, "nan", 1000.0), (settings.LOG_TOTAL_MB, "", 1000.0),
])
def test_one_parser_reads_each_kind_and_a_bad_value_is_the_default(setting, given, read):
    environ = {} if given is None else {setting.name: given}
    value = settings.read(setting, environ)
    assert value == read and type(value) is type(read)
