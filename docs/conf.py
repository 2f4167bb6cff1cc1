"""Sphinx configuration: ``sphinx-build -W --keep-going -b html docs docs/_build/html``."""

from __future__ import annotations

import scrapy_bloomdupe

project = "scrapy-bloomdupe"
author = "the scrapy-bloomdupe authors"
copyright = "2026, the scrapy-bloomdupe authors"
version = release = scrapy_bloomdupe.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]

# Markdown: anchors for "## headings" so pages can link to each other's sections.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}


html_theme = "furo"
html_title = f"scrapy-bloomdupe {release}"
