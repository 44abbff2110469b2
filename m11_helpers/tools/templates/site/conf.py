# Sphinx configuration of the course site, written by `m11 site` (m11_helpers/tools/course_site.py): nothing here
# reaches the network at build or view time. MyST-NB reads the notebooks as executed (execution off).
project = "M11 · Training at Scale"
author = "The M11 · Training at Scale maintainers"
extensions = ["myst_nb"]
nb_execution_mode = "off"                    # the notebooks come executed (m11 course, or the test suite's run)
nb_ipywidgets_js = {}                        # no widget manager from a CDN: widgets are explained on the page
myst_enable_extensions = ["dollarmath", "amsmath"]
mathjax_path = "mathjax/tex-chtml-full.js"   # MathJax 3 from _static/, the copy set-up fetched (tools/assets.py)
html_theme = "alabaster"                     # ships with Sphinx: no theme package, no web fonts
html_static_path = ["_static"]
html_css_files = ["m11-site.css"]
html_theme_options = {"description": "How large models are trained", "fixed_sidebar": False,
                      "page_width": "min(1200px, 100%)", "sidebar_width": "240px", "font_family": "sans-serif",
                      "head_font_family": "sans-serif", "code_font_family": "monospace", "show_relbars": True}
html_sidebars = {"**": ["about.html", "searchfield.html", "navigation.html", "relations.html"]}
html_show_sourcelink = False                 # the notebooks' JSON is on GitHub; the badges link there
html_copy_source = False
exclude_patterns = ["_build"]
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header", "misc.highlighting_failure"]
