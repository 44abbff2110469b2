"""The numbers a lesson notebook shows (its markdown and its cells' outputs), for tests/test_quizzes.py.

A transfer question must ask for a number the lesson did not print: `printed_answers(question, numbers)`
lists the right answer's numbers found among a notebook's. Numbers are compared as values, with the
tolerance of the answer's rounding (or the lesson's, when it prints a decimal of three significant digits): "27 %", "0.27",
"27.3%" and "3/11" are one number.
"""

from __future__ import annotations

import html
import re

# 1,979 · 2.6 · 3.15e23 · .5 (a leading sign is ignored: the magnitude is what a question asks for)
_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?|\.\d+)(?:[eE]([+-]?\d+))?(\s?%)?(?![\w])")
_FRACTION = re.compile(r"(?<![\w./])(\d+)\s?/\s?(\d+)(?![\w./])")
_TAG = re.compile(r"<[^>]+>")
TRIVIAL = 16  # integers up to this (ranks, K, stages, "2×") are in every lesson: they identify nothing


def numbers(text: str) -> list[tuple[float, float]]:
    """(value, half a unit of its last digit) for every number in text; a percentage also as a fraction."""
    found = []
    for m in _NUMBER.finditer(text):
        digits, exp, pct = m.group(1).replace(",", ""), m.group(2), m.group(3)
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        scale = 10.0 ** int(exp) if exp else 1.0
        value, half = float(digits) * scale, 0.5 * 10.0 ** -decimals * scale
        found.append((value, half))
        if pct:
            found.append((value / 100, half / 100))
    for m in _FRACTION.finditer(text):
        a, b = int(m.group(1)), int(m.group(2))
        if b:
            found.append((a / b, 1e-9))
    return found


# a cell that times or fits something prints a different figure on every machine and run (CONTRIBUTING: such
# cells are not checked); a derived answer may equal one of them by chance, so their outputs are left out
_MEASURES = re.compile(r"time|bench|measur|throughput|speed|profil|fit", re.I)
_UNITS = re.compile(r"\d\s?(?:ms|µs|us|ns|s)\b|/s\b|per second", re.I)


def _checked(cell) -> bool:
    return cell.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT")


def notebook_text(nb, outputs: bool = True) -> str:
    """Markdown cells and, if asked, the outputs (text/plain, stream, text/html with tags stripped) of every
    checked cell and of every other cell that neither times nor fits (source) nor prints a time or a rate."""
    parts = [c.source for c in nb.cells if c.cell_type == "markdown"]
    for cell in nb.cells if outputs else []:
        if cell.cell_type != "code" or (not _checked(cell) and (_MEASURES.search(cell.source) or any(
                _UNITS.search(o.get("text", "") + o.get("data", {}).get("text/plain", ""))
                for o in cell.get("outputs", [])))):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            data = out.get("data", {})
            parts.append(data.get("text/plain", ""))
            parts.append(html.unescape(_TAG.sub(" ", data.get("text/html", ""))))
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def distinctive(question) -> list[tuple[float, float]]:
    """The right option's numbers that the prompt does not give and that are not small integers."""
    given = numbers(question.prompt)
    out = []
    for value, half in numbers(question.options[question.answer]):
        if value == int(value) and half >= 0.5 and value <= TRIVIAL:
            continue
        if any(_same(value, half, g, gh) for g, gh in given):
            continue
        out.append((value, half))
    return out


def printed_answers(question, shown: list[tuple[float, float]]) -> list[float]:
    """The right answer's distinctive numbers that are among `shown` (a notebook's numbers)."""
    hits = []
    for value, half in distinctive(question):
        if any(_same(value, half, s, sh) for s, sh in shown):
            hits.append(value)
    return hits


def _same(a: float, ha: float, b: float, hb: float) -> bool:
    """a (the answer, ± ha) equals b (printed, ± hb): within the answer's rounding, or within the lesson's if that
    is a decimal of three significant digits ("27 %" is the lesson's 27.3 %, "30.43 %" its "30.4"; its "52 ms"
    is not 52.2, nor its measured "0.77 GB/s" a ratio of 0.774)."""
    tol = max(ha, hb) if hb < 0.5 and hb <= 0.002 * abs(b) else ha
    return abs(a - b) <= tol and tol <= 0.05 * max(abs(a), abs(b))
