"""A pytest plugin for the course's own test suite: nbformat's start without jsonschema's IRI grammar.

pyproject.toml's pytest `addopts` loads it with `-p`, which pytest imports before the plugins packages
declare (nbval's imports nbformat): the controller and every pytest-xdist worker then start ~1.3 s of
CPU sooner (fast_start.py says why that import costs it). `m11` and the grader's pytest process do the same
themselves (cli.py, grading/engine/plugin.py).
"""

from m11_helpers.tools.fast_start import skip_iri_grammar

skip_iri_grammar()
