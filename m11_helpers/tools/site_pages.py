"""What a page of the course site shows (`m11 site`, tools/course_site.py): a lesson as read, an exercise as set.

- A lesson page is the executed notebook without what is the presenter's (speaker-notes cells) or the
  test harness's (nbval marker lines), with each widget's output explained (its live state needs a
  kernel), and under the title the Open-in-Colab / Studio Lab links and links to the exercises and
  the deck. The badges are links, never remote images: the site makes no request off itself.
- An exercise page is the exercise notebook's statements: no outputs, and it refuses any cell that
  holds an instructor region (`### BEGIN SOLUTION`, `### BEGIN HIDDEN TESTS`) — exercises/ is generated
  without them (grading/exercises.py); a page that had one would publish the answer.
- `leaks(site, regions)` is the site's last gate: which instructor text (solution and hidden-test
  regions, wrong answers, speaker notes) appears, word for word, in the built pages' text or search index.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat

from m11_helpers.tools.setup_cell import badge_urls
from m11_helpers.tools.slides import NBVAL_MARKER, OUTPUT_ONLY_TAG, WIDGET_VIEW, deck_title

__all__ = ["lesson_page", "exercise_page", "deck_view", "instructor_regions", "words", "page_text", "leaks",
           "InstructorText"]

REGION = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", re.S)
WIDGET_NOTE = ("<p class=\"m11-widget\"><em>An interactive widget ({what}) is here in the notebook: open the lesson "
               "in Colab, Studio Lab or JupyterLab (links at the top) to move it. The text and plots around it are "
               "as the lesson computed them.</em></p>")


class InstructorText(ValueError):
    """A notebook meant for the site holds a solution or hidden-test region: it is never published."""


def _notes(cell) -> bool:
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type") == "notes"


def _explain_widgets(nb: nbformat.NotebookNode) -> None:
    nb.metadata.pop("widgets", None)  # the saved widget state needs the HTML manager (a CDN script)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                what = html.escape(str(data.get("text/plain", "a control")).split("(")[0][:40])
                out.data = {"text/html": WIDGET_NOTE.format(what=what)}


def _links(stem: str) -> str:
    badges = badge_urls(f"course/{stem}.ipynb")
    return (f'<p class="m11-links"><a class="m11-badge" href="{badges["colab"]}">Open in Colab</a> '
            f'<a class="m11-badge" href="{badges["studiolab"]}">Open in SageMaker Studio Lab</a> '
            f'<a class="m11-badge" href="../exercises/{stem}.html">Exercises</a> '
            f'<a class="m11-badge" href="../slides/{stem}.slides.html">Slides</a></p>')


def lesson_page(src: Path, stem: str) -> nbformat.NotebookNode:
    """The lesson as the site shows it (src: the executed notebook, or the stored one)."""
    nb = nbformat.read(src, as_version=4)
    nb.cells = [c for c in nb.cells if not _notes(c)]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = NBVAL_MARKER.sub("", cell.source)
            if OUTPUT_ONLY_TAG in cell.metadata.get("tags", []):
                cell.metadata.setdefault("tags", []).append("remove-input")  # MyST-NB: the output only
    _explain_widgets(nb)
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), -1)
    nb.cells.insert(first + 1, nbformat.v4.new_markdown_cell(_links(stem)))
    _refuse_regions(nb, src)
    return nb


def exercise_page(src: Path, stem: str) -> nbformat.NotebookNode:
    """The exercise statements: every cell's source, no outputs, a link back to the lesson."""
    nb = nbformat.read(src, as_version=4)
    _refuse_regions(nb, src)
    nb.cells = [c for c in nb.cells if not _notes(c)]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    title = deck_title(nb, stem)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(
        f"# Exercises: {title}\n\n<p class=\"m11-links\"><a class=\"m11-badge\" href=\"../lessons/{stem}.html\">"
        f"The lesson</a> <a class=\"m11-badge\" href=\"{badge_urls(f'exercises/{stem}.ipynb')['colab']}\">"
        "Open the exercises in Colab</a></p>\n\nEach exercise below is to be written in the notebook; its "
        "check cell grades it (`m11 grade`)."))
    return nb


def deck_view(src: Path) -> nbformat.NotebookNode:
    """The notebook a public deck is built from: without its speaker notes."""
    nb = nbformat.read(src, as_version=4)
    nb.cells = [c for c in nb.cells if not _notes(c)]
    return nb


def _refuse_regions(nb: nbformat.NotebookNode, src: Path) -> None:
    for i, cell in enumerate(nb.cells):
        if "### BEGIN SOLUTION" in cell.source or "### BEGIN HIDDEN TESTS" in cell.source:
            raise InstructorText(f"notebook={str(src)!r}: cell {i} holds a solution or hidden-test region; "
                                 "the site publishes exercises/ (regenerate it: m11 make-exercises), never solutions/")


def instructor_regions(solutions: Path, course: Path) -> dict[str, str]:
    """{where: text}: every solution and hidden-test region of solutions/*.ipynb, every function of the
    wrong answers (solutions/wrong_answers/*.py) and every paragraph of the speaker notes of course/*.ipynb."""
    out: dict[str, str] = {}
    for nb_path in sorted(solutions.glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(nb_path, as_version=4).cells):
            for j, (kind, body) in enumerate(REGION.findall(cell.source)):
                out[f"{nb_path.name} cell {i} {kind.lower()} {j}"] = body
    for py in sorted((solutions / "wrong_answers").glob("*.py")):
        for j, block in enumerate(re.split(r"\n(?=def |class )", py.read_text(encoding="utf-8"))):
            out[f"wrong_answers/{py.name} part {j}"] = block
    for nb_path in sorted(course.glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(nbformat.read(nb_path, as_version=4).cells):
            if _notes(cell):
                for j, para in enumerate(re.split(r"\n\s*\n", cell.source)):
                    out[f"{nb_path.name} cell {i} speaker notes {j}"] = re.sub(r"\]\([^)]*\)|<[^>]+>", " ", para)
    return out


def words(text: str) -> str:
    """The text as its words and numbers, one space apart: what survives highlighting, Markdown and HTML."""
    return " ".join(re.findall(r"\w+", text)).lower()


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style") and self.skip > 0

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def page_text(page: Path) -> str:
    """A built page's visible text, whitespace collapsed (code highlighting splits lines into spans)."""
    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    return " ".join("".join(parser.parts).split())


def leaks(site: Path, regions: dict[str, str], allowed: str = "", least: int = 6) -> dict[str, list[str]]:
    """{page: [where]} for each instructor text (a region of at least `least` words) whose words appear,
    in order and together, in a built page's text or the search index; texts whose words also appear in
    `allowed` (what the course shows anyway: the lessons' and exercises' own cells) are not counted."""
    texts = {str(p.relative_to(site)): words(page_text(p)) for p in site.rglob("*.html")}
    texts.update({str(p.relative_to(site)): words(p.read_text(encoding="utf-8")) for p in site.rglob("searchindex.js")})
    allowed = words(allowed)
    found: dict[str, list[str]] = {}
    for where, text in regions.items():
        needle = words(text)
        if needle.count(" ") + 1 < least or needle in allowed:
            continue
        for page, have in texts.items():
            if needle in have:
                found.setdefault(page, []).append(f"{where}: {text.strip()[:80]}")
    return found
