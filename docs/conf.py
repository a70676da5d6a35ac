"""Sphinx configuration of nbddp's documentation (build: ``bash scripts/docs.sh``).

Sphinx with MyST (Markdown pages) and myst-nb (the lessons' executed copies, docs/lessons/*.ipynb,
rendered as they are: execution is off, the copies are made by notebooks/executed.py). The
reference pages are generated at build time from nbddp itself by docs/_ext/nbddp_docs.py.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.dirname(HERE))  # nbddp from this checkout

import nbddp  # noqa: E402 - this checkout's, on the path just above

project = "nbddp"
author = "the nbddp authors"
copyright = "nbddp authors, MIT licence"
version = release = nbddp.__version__

extensions = [
    "myst_nb",                 # Markdown pages (MyST) and notebooks
    "sphinx.ext.autodoc",      # the Python API from its docstrings
    "sphinx_copybutton",
    "nbddp_docs",              # the generated reference tables (options, hints, lessons)
]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# The lessons are rendered from their executed copies, never run here.
nb_execution_mode = "off"
nb_merge_streams = True
# ipywidgets' view (the live view) has no saved state in the executed copies: a reader sees the
# transcript nbddp leaves in its place, so the widget mime type is simply not shown.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]

myst_enable_extensions = ["colon_fence", "deflist", "attrs_inline"]
myst_heading_anchors = 3

autodoc_typehints = "none"      # signatures as written; the docstrings say what each argument is
autodoc_member_order = "bysource"

nitpicky = True
smartquotes = False  # messages and hints are shown as nbddp prints them (tests/kernel/test_docs.py finds them)

html_theme = "furo"
html_title = f"nbddp {release}"
html_static_path = []
html_show_sourcelink = False

# Where "open on Binder" points (owner/name of the GitHub repository); empty: no Binder link,
# only the local command. Set it for a published copy of the docs.
nbddp_binder_repo = os.environ.get("NBDDP_BINDER_REPO", "")
