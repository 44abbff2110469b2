"""`m11 slides`: decks open offline, every local reference exists, notes and slide structure survive."""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from m11_helpers.tools.assets import PACKAGES, assets_dir, installed
from m11_helpers.tools.slides import ASSETS, CDN, OUTPUT_ONLY_TAG, WIDGET_VIEW, build_deck, main, write_index

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "slides" / "demo.ipynb"
LESSON_00 = REPO / "course" / "00_welcome.ipynb"

needs_assets = pytest.mark.skipif(
    not installed(assets_dir()),
    reason=f"slide assets not in {assets_dir()}: run `.venv/bin/python -m m11_helpers.tools.assets`",
)
REMOTE = re.compile(r"^\s*(?:https?:)?//", re.I)
CSS_REF = re.compile(r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""", re.I)
JS_IMPORT = re.compile(r"""\bimport\b[^'";]*?\bfrom\s*['"]([^'"]+)|\bimport\s*\(\s*['"]([^'"]+)""")
REQUIRED_JS = re.compile(r"""["']([^"'\s]+\.js)["']""")  # module paths in require([...])


class _Deck(HTMLParser):
    """Collects what a browser would fetch, the slide tree, and the speaker notes."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []  # src/href a browser loads (script, link, img, source)
        self.css: list[str] = []  # inline <style> text
        self.scripts: list[str] = []  # inline <script> text
        self.top = self.sub = self.depth = 0
        self.notes: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and a.get("src") is not None:
            self.refs.append(a["src"] or "")
        elif tag == "link" and a.get("href"):
            self.refs.append(a["href"])
        elif tag in ("img", "source", "iframe", "embed") and a.get("src"):
            self.refs.append(a["src"])
        if tag == "section":
            self.depth += 1
            self.top += self.depth == 1
            self.sub += self.depth == 2
        if tag in ("script", "style") or (tag == "aside" and "notes" in (a.get("class") or "")):
            self._in = tag
            (self.notes if tag == "aside" else self.scripts if tag == "script" else self.css).append("")
        if tag == "script" and self._in == "script" and "type" in a and "json" in (a["type"] or ""):
            self.scripts.pop()  # data, not code
            self._in = None

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.depth -= 1
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        target = {"script": self.scripts, "style": self.css, "aside": self.notes}.get(self._in or "")
        if target is not None:
            target[-1] += data


def _local(ref: str) -> str | None:
    """The file part of a local reference, or None for data:, anchors and javascript:."""
    ref = ref.split("#")[0].split("?")[0].strip()
    if not ref or re.match(r"^(data|javascript|blob|about):", ref, re.I):
        return None
    return ref


def _check_css(text: str, base: Path, seen: set[Path]) -> None:
    """No remote url()/@import; local ones exist, followed through imported stylesheets."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # links in comments are never fetched
    for match in CSS_REF.finditer(text):
        ref = match.group(1) or match.group(2)
        assert not REMOTE.match(ref), f"remote CSS reference {ref!r} (from {base})"
        if (path := _local(ref)) is not None:
            target = (base / path).resolve()
            assert target.is_file(), f"CSS reference {ref!r} from {base} does not exist"
            if target.suffix == ".css" and target not in seen:
                seen.add(target)
                _check_css(target.read_text(encoding="utf-8"), target.parent, seen)


def _check_offline(deck: Path) -> _Deck:
    parsed = _Deck()
    parsed.feed(deck.read_text(encoding="utf-8"))
    base, seen = deck.parent, set()
    for ref in parsed.refs:
        assert not REMOTE.match(ref), f"{deck.name}: remote reference {ref!r}"
        if (path := _local(ref)) is not None:
            assert (base / path).is_file(), f"{deck.name}: {ref!r} does not exist next to the deck"
            if path.endswith(".css"):
                _check_css((base / path).read_text(encoding="utf-8"), (base / path).parent, seen)
    for css in parsed.css:
        _check_css(css, base, seen)
    for script in parsed.scripts:
        for match in JS_IMPORT.finditer(script):
            ref = match.group(1) or match.group(2)
            assert not REMOTE.match(ref), f"{deck.name}: remote JS import {ref!r}"
        for ref in REQUIRED_JS.findall(script):
            assert not REMOTE.match(ref), f"{deck.name}: remote script {ref!r}"
            assert (base / ref).is_file(), f"{deck.name}: required {ref!r} does not exist"
    return parsed


def _expected_sections(nb_path: Path) -> tuple[int, int]:
    """(slides, slides + subslides) as nbconvert builds them: the first shown cell opens a slide."""
    types = [c.metadata.get("slideshow", {}).get("slide_type", "-")
             for c in nbformat.read(nb_path, as_version=4).cells]
    shown = [t for t in types if t not in ("skip", "notes")]
    slides = 1 + sum(t == "slide" for t in shown[1:]) if shown else 0
    return slides, slides + sum(t == "subslide" for t in shown[1:])


@needs_assets
def test_fixture_deck_is_offline_with_notes_and_structure(tmp_path: Path) -> None:
    # a widget output and its saved state, as an executed lab cell leaves them (the stored fixture is clean)
    nb = nbformat.read(FIXTURE, as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "IntSlider(value=8)", WIDGET_VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0}})]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2,
                                                                            "version_minor": 0}}
    nbformat.write(nb, tmp_path / FIXTURE.name)
    deck = build_deck(tmp_path / FIXTURE.name, tmp_path)
    parsed = _check_offline(deck)
    assert (parsed.top, parsed.sub) == _expected_sections(FIXTURE) == (3, 4)
    assert any("SPEAKER-NOTE-MARKER" in n for n in parsed.notes), "notes cell lost"
    text = deck.read_text(encoding="utf-8")
    assert "SKIPPED-MARKER" not in text
    assert "widget-state+json" not in text and "interactive widget" in text
    assert "_assets/mathjax/tex-chtml-full.js" in text and "RevealNotes" in text
    assert "Demo deck: slides offline slides</title>" in text


@needs_assets
def test_cli_writes_index_and_shared_assets(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(FIXTURE), "--out", str(tmp_path)]) == 0
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert '<a href="demo.slides.html">Demo deck: slides offline</a>' in index
    assert installed(tmp_path / "_assets")
    _check_offline(write_index(tmp_path))


@needs_assets
@pytest.mark.slow
@pytest.mark.skipif(not LESSON_00.exists(), reason="course/00_welcome.ipynb not written yet")
def test_lesson_00_deck(tmp_path: Path) -> None:
    parsed = _check_offline(build_deck(LESSON_00, tmp_path))
    assert (parsed.top, parsed.sub) == _expected_sections(LESSON_00)


def test_missing_assets_say_how_to_fetch_with_this_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("M11_ASSETS", str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match=re.escape(f"{sys.executable} -m m11_helpers.tools.assets")):
        build_deck(FIXTURE, tmp_path / "out")
    assert main([str(FIXTURE), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "m11 slides --cdn" in err and sys.executable in err and ".venv/bin" not in err.replace(sys.prefix, "")


def test_cdn_deck_needs_no_assets_and_links_the_pinned_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M11_ASSETS", str(tmp_path / "nothing"))
    assert main([str(FIXTURE), "--out", str(tmp_path / "out"), "--cdn"]) == 0
    text = (tmp_path / "out" / "demo.slides.html").read_text(encoding="utf-8")
    for package, version in PACKAGES.items():
        assert f"{CDN}/{package}@{version}/" in text, package
    assert not (tmp_path / "out" / ASSETS).exists() and "_assets/" not in text


def test_decks_show_what_a_presenter_shows(tmp_path: Path) -> None:
    """No nbval markers; an `m11-output-only` cell shows its output without its code; teaching code stays."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Presenter view", metadata={"slideshow": {"slide_type": "slide"}}),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nteaching_line = 6 * 7\nprint(teaching_line)"),
        nbformat.v4.new_code_cell("print(f'{\"FORMATTING-ONLY\":>20}')", metadata={"tags": [OUTPUT_ONLY_TAG]}),
    ])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="42\n")]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="TABLE-OUTPUT\n")]
    path = tmp_path / "presenter.ipynb"
    nbformat.write(nb, path)
    text = build_deck(path, tmp_path / "out", cdn=True).read_text(encoding="utf-8")
    assert "NBVAL" not in text
    assert "teaching_line" in text and "42" in text
    assert "TABLE-OUTPUT" in text and "FORMATTING-ONLY" not in text
    assert nbformat.read(path, as_version=4).cells[1].source.startswith("# NBVAL_CHECK_OUTPUT")  # file untouched


def test_bad_notebook_path_names_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="notebook_path"):
        build_deck(tmp_path / "missing.ipynb", tmp_path)
