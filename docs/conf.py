"""Sphinx configuration of the course's documentation site: `./course docs` builds it into build/docs/ and opens it.

The pages are MyST Markdown (myst-parser), so they read the same on GitHub as on the site. The suite builds the
site with warnings as errors (tests/test_docs.py): a broken link, a missing page or an unknown reference fails.
"""

project = "Training Mechanics Lab"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
# Headings up to ### get anchors, so a page can link to `page.md#a-heading`; a link to an anchor that does not
# exist is a warning, and so an error in the suite.
myst_heading_anchors = 3
# furo: a maintained theme whose fonts and scripts ship with it, so the built site opens offline.
html_theme = "furo"
html_title = project
html_show_sourcelink = False
# Code blocks may hold pseudo-code (`observe(name, value, rtol=…)` in CONTRIBUTING.md): Pygments then highlights
# them loosely instead of failing the strict build.
suppress_warnings = ["misc.highlighting_failure"]
html_copy_source = False
