"""Showing things in a lesson: a table learners read as a table, and the source of a tested helper.

    show_table([("DDP", 16.0), ("ZeRO-1", 5.5)], headers=["setup", "GB/GPU"], floatfmt=".1f")
    show_source(ring_all_reduce)          # the code the lesson runs, from the package

In a notebook a table renders as HTML (and on slides); in a terminal, or in a checked output, it is
an aligned plain-text table: both come from the same rows, so they cannot disagree. `show_source`
shows the package's code rather than a copy in the notebook, so what learners read is what the tests test.
"""

from __future__ import annotations

import html
import inspect
import numbers
import textwrap
from typing import Any, Iterable, Sequence

__all__ = ["Table", "show_table", "show_source"]


def _cell(x: Any, floatfmt: str) -> str:
    if isinstance(x, bool) or x is None:
        return "" if x is None else str(x)
    if isinstance(x, numbers.Integral):
        return f"{x:,}"
    if isinstance(x, numbers.Real):
        return format(float(x), floatfmt)
    return str(x)


class Table:
    """Rows of cells with headers; `_repr_html_` for notebooks, `str` for terminals and checked outputs."""

    def __init__(self, rows: Iterable[Sequence[Any] | dict], headers: Sequence[str] | None = None, *,
                 floatfmt: str = ".3g", title: str | None = None):
        rows = list(rows)
        if rows and isinstance(rows[0], dict):
            headers = list(headers or rows[0].keys())
            rows = [[r.get(h) for h in headers] for r in rows]
        self.headers = [str(h) for h in (headers or [])]
        self.cells = [[_cell(x, floatfmt) for x in r] for r in rows]
        self.numeric = [all(isinstance(r[j], numbers.Number) and not isinstance(r[j], bool) for r in rows if j < len(r))
                        for j in range(max([len(self.headers)] + [len(r) for r in rows]))]
        self.title = title

    def __str__(self) -> str:
        table = ([self.headers] if self.headers else []) + self.cells
        if not table:
            return ""
        width = [max(len(r[j]) for r in table if j < len(r)) for j in range(len(self.numeric))]

        def line(r: list[str]) -> str:
            return "  ".join((c.rjust(width[j]) if self.numeric[j] else c.ljust(width[j]))
                             for j, c in enumerate(r)).rstrip()

        out = [self.title] if self.title else []
        if self.headers:
            out += [line(self.headers), "  ".join("-" * w for w in width)]
        return "\n".join(out + [line(r) for r in self.cells])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        align = ["right" if n else "left" for n in self.numeric]
        head = "".join(f'<th style="text-align:{align[j]}">{html.escape(h)}</th>' for j, h in enumerate(self.headers))
        body = "".join("<tr>" + "".join(f'<td style="text-align:{align[j]}">{html.escape(c)}</td>'
                                        for j, c in enumerate(r)) + "</tr>" for r in self.cells)
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def show_table(rows: Iterable[Sequence[Any] | dict], headers: Sequence[str] | None = None, *,
               floatfmt: str = ".3g", title: str | None = None) -> None:
    """Display rows as a table (HTML in a notebook, aligned text elsewhere).

    Returns None, like `display`, so a cell ending in it shows the table once; build a `Table`
    yourself to keep or test one.
    """
    table = Table(rows, headers, floatfmt=floatfmt, title=title)
    if _in_notebook():
        from IPython.display import display

        display(table)
    else:
        print(table)


def show_source(obj: Any) -> None:
    """Display the source of a function or class from the package, highlighted in a notebook."""
    source = textwrap.dedent(inspect.getsource(obj))
    if _in_notebook():
        from IPython.display import Code, display

        display(Code(source, language="python"))
    else:
        print(source)
