"""The lessons as the tests read them: notebooks/build.py (a lesson's source in notebooks/src/ to
its notebook) and notebooks/executed.py (executed, scrubbed copies in docs/lessons/), loaded as
modules (neither writes anything when imported), and the lesson notebooks' names."""
import glob
import importlib.util
import os

from support import ROOT

NOTEBOOKS = os.path.join(ROOT, "notebooks")
ARTIFACTS = os.path.join(ROOT, "artifacts", "notebooks")
NOTEBOOK_FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(NOTEBOOKS, "[0-9][0-9]_*.ipynb")))


def _load(script):
    """A script of notebooks/ as a module."""
    spec = importlib.util.spec_from_file_location("lessons_" + script, os.path.join(NOTEBOOKS, script + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load("build")  # notebooks/build.py: notebooks/src/NN_name.py -> notebooks/NN_name.ipynb
executed = _load("executed")  # notebooks/executed.py: executed, scrubbed copies in docs/lessons/
LESSONS = [build.notebook_name(source) for source in build.sources()]
