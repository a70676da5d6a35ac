"""The benchmarks' own plumbing still fits the package: benchmarks/phases.py wraps nbddp's launch
steps by name, so a step renamed or moved (the #23 layout moved ``host_store``) broke the
profile of ``bench.py`` without failing any test."""
import importlib.util
import os

import pytest

import support

ROOT = str(support.ROOT)
spec = importlib.util.spec_from_file_location("phases", os.path.join(ROOT, "benchmarks", "phases.py"))
phases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(phases)


@pytest.mark.parametrize("module, cls, name, label", phases.STEPS, ids=[step[3] for step in phases.STEPS])
def test_every_step_the_profile_wraps_is_where_the_launch_looks_it_up(module, cls, name, label):
    assert callable(getattr(phases.owner_of(module, cls), name, None)), f"{module}.{cls or ''}.{name} is gone"
