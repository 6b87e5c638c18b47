"""Sphinx configuration of ffload's documentation site (``sphinx-build -W --keep-going -n docs docs/_build``).

The pages are Markdown (myst-parser); the API reference is generated from the docstrings (autodoc, napoleon's
Google style, autosummary), the command-line reference from the click group (sphinx-click). Intersphinx reads
vendored inventories only (``docs/_intersphinx/``, see its README): the build needs no network.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # this checkout's ffload, whatever the environment has installed

import ffload  # noqa: E402

project = "ffload"
author = "The ffload developers"
copyright = "The ffload developers, Apache License 2.0"
release = version = ffload.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx_click",
    "ffload_refs",  # docs/_ext: ffload's own names resolved where they are documented
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_intersphinx", "README.md", "**/README.md"]
templates_path = ["_templates"]

html_theme = "furo"
html_title = f"ffload {release}"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# API reference: napoleon reads the Google-style sections (Args, Returns, Raises, Attributes) the code uses
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # an Attributes section as fields: autodoc documents the attributes themselves
autosummary_generate = True
autosummary_imported_members = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_default_options = {"members": True, "show-inheritance": True}

# intersphinx: vendored inventories (docs/_intersphinx/README.md); the URLs are only the links' targets
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", str(DOCS / "_intersphinx" / "python.inv")),
    "numpy": ("https://numpy.org/doc/stable", str(DOCS / "_intersphinx" / "numpy.inv")),
    "torch": ("https://docs.pytorch.org/docs/stable", str(DOCS / "_intersphinx" / "torch.inv")),
}
intersphinx_timeout = 1

# nitpicky (-n): every reference to ffload's own names must resolve; third-party names without an inventory
# (numba, click, lmdb, fsspec, ray, ffcv, torchvision, PIL, OpenCV) are named here instead
nitpicky = True
nitpick_ignore_regex = [
    ("py:.*", r"(numba|click|lmdb|fsspec|ray|ffcv|torchvision|PIL|cv2|tqdm|datasets|albumentations)(\..*)?"),
]
