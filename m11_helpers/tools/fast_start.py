"""What the m11 tools' processes need not pay for at start-up.

`import nbformat` imports jsonschema, which imports `rfc3987_syntax` when it is installed (JupyterLab's
dependencies bring it): that module builds a Lark grammar at import, 1.1 s of CPU on this project's
machines out of 1.2 s for all of `import nbformat`, only to validate IRI-formatted strings, which no
notebook schema holds. Every `m11` command and every graded notebook's pytest process imports nbformat.
"""

from __future__ import annotations

import sys

__all__ = ["skip_iri_grammar"]


def skip_iri_grammar() -> None:
    """Before nbformat is imported: make jsonschema's optional `import rfc3987_syntax` fail at once.

    A None entry in `sys.modules` is how Python spells "this import fails"; jsonschema then leaves out
    the "iri" format checks, as it does wherever the package is not installed. Only for our own
    processes (the `m11` command, the grader's pytest process), never in a learner's kernel.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
