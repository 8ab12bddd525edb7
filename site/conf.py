"""Sphinx configuration of the course website; `python -m course site build` writes the sources
(build/site-src) and runs Sphinx with this folder as its configuration directory."""

from course.notebooks import REPO_URL
from course.site import mathjax_dir

project = "Sequence Models, from RNNs to Transformers"
author = "the course authors"
copyright = "the course authors, MIT license"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.viewcode", "course.site"]

# Notebooks are rendered with their committed outputs, never executed.
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # no widget JavaScript from a CDN
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]

# API pages: every member in source order, with its source one click away (viewcode).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
default_role = "literal"  # `x` in a docstring is code, as in the notebooks

# Offline: MathJax is copied from the sphinx-mathjax-offline package into _static/mathjax.
mathjax_path = "mathjax/tex-chtml.js"
html_static_path = ["_static", str(mathjax_dir())]
html_css_files = ["course.css"]
html_js_files = ["course.js"]  # small screens: scrolling tables say so, figures open full size
html_favicon = "_static/favicon.svg"
html_context = {"default_mode": "light"}  # the theme logs a console error without one
html_theme = "sphinx_book_theme"
html_title = "Sequence Models"
html_last_updated_fmt = None
html_show_sphinx = False
html_theme_options = {
    "repository_url": REPO_URL,
    "use_repository_button": True,
    "use_download_button": True,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    # no right-hand column: each notebook page lists its sections under its title instead
    # (course.site.notebook_page), and the article gets the width, so 120-character code lines
    # and results tables fit (tests/test_site.py)
    "secondary_sidebar_items": [],
    "navbar_persistent": [],  # one search box on a page: the sidebar's, not a second in the header
}
