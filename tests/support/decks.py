"""Decks as an instructor shows them: built from executed notebooks, every slide measured in Chromium.

    sources = deck_sources()             # course/NN.ipynb -> the executed copy when fresh, else the stored one
    report = measure_deck(page, deck)    # every slide (all fragments shown): what is cut at an edge

A box "overflows" when its content is wider than the box (scrollWidth > clientWidth) and the box does
not scroll, or when it reaches past the slide's right edge: either way the audience loses the end of
a line. Code must wrap (a code box never scrolls sideways); an output may scroll inside its own box.
A slide taller than the screen scrolls (the deck template sets it), which is counted, not failed.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
EXECUTED = ROOT / "build" / "test-artifacts" / "executed"  # written by tests/conftest.py's nbval copies
REVEAL = "_assets/reveal.js/dist/reveal.js"

SETUP = f"""new Promise(ok => require(['{REVEAL}'], R => {{
    window.M11R = R; R.configure({{transition: 'none', backgroundTransition: 'none'}});
    ok(R.getSlides().map(s => {{ const i = R.getIndices(s); return [i.h, i.v || 0]; }})); }}))"""

# one slide: show it with all its fragments, wait two frames for layout and MathJax, then measure
MEASURE = """new Promise(ok => { M11R.slide(%d, %d, 1e6);
  requestAnimationFrame(() => requestAnimationFrame(() => {
    const s = M11R.getCurrentSlide(), edge = s.getBoundingClientRect().right + 1;
    const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
    const wide = e => e.scrollWidth - e.clientWidth > 1;
    const name = e => (e.className && e.className.baseVal === undefined ? e.className : e.tagName).toString().slice(0, 60);
    const text = e => (e.innerText || '').trim().split('\\n')[0].slice(0, 70);
    const cut = [];
    if (wide(s)) cut.push(['slide', s.scrollWidth, s.clientWidth, text(s)]);
    for (const e of s.querySelectorAll('.highlight pre, .jp-InputArea-editor')) {
      if (wide(e)) cut.push(['code does not wrap', e.scrollWidth, e.clientWidth, text(e)]);
    }
    for (const e of s.querySelectorAll('.jp-OutputArea-output, .jp-RenderedMarkdown, .jp-Cell, .jp-RenderedHTMLCommon')) {
      if (wide(e) && !scrolls(e)) cut.push([name(e), e.scrollWidth, e.clientWidth, text(e)]);
    }
    for (const e of s.querySelectorAll('pre, img, svg, table, mjx-container, p, li')) {
      const r = e.getBoundingClientRect(), box = e.closest('.jp-OutputArea-output');
      const clip = box && scrolls(box) ? box.getBoundingClientRect().right + 1 : edge;
      if (r.width > 0 && r.right > clip && r.right > edge) cut.push(['past the slide edge: ' + e.tagName, Math.round(r.right), Math.round(edge), text(e)]);
    }
    ok({cut: cut, tall: s.scrollHeight - s.clientHeight > 1,
        images: s.querySelectorAll('.jp-OutputArea-output img').length});
  })); })"""


def _code_sources(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def deck_sources() -> dict[str, tuple[Path, bool]]:
    """{stem: (notebook to build the deck from, executed?)} for every course notebook.

    The executed copy (every cell run by this or an earlier session's nbval, tests/conftest.py) is used
    when it is complete and its code is the notebook's current code; else the stored notebook, whose
    only outputs are its checked ones."""
    out = {}
    for src in sorted((ROOT / "course").glob("[0-9][0-9]_*.ipynb")):
        executed = EXECUTED / src.name
        use = (src, False)
        if executed.is_file():
            run = nbformat.read(executed, as_version=4)
            fresh = _code_sources(run) == _code_sources(nbformat.read(src, as_version=4))
            if fresh and run.metadata.get("m11_executed", {}).get("complete"):
                use = (executed, True)
        out[src.stem] = use
    return out


def measure_deck(page, deck: Path) -> dict:
    """Open deck in page (a support.browser.Chromium) and measure every slide; a report dict."""
    from support.browser import wait_for

    page.goto(deck.as_uri())
    wait_for(lambda: page.evaluate(f"typeof require === 'function' && new Promise(ok => require(['{REVEAL}'], "
                                   "R => ok(R.isReady())))"), 30, f"{deck.name}'s reveal.js to initialise")
    slides = page.evaluate(SETUP)
    report = {"slides": len(slides), "cut": [], "tall": [], "images": 0}
    for h, v in slides:
        got = page.evaluate(MEASURE % (h, v))
        report["cut"] += [(f"{h}.{v}", *c) for c in got["cut"]]
        report["images"] += got["images"]
        if got["tall"]:
            report["tall"].append(f"{h}.{v}")
    return report
