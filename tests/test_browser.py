"""Real-browser checks with the OS's headless Chromium (no browser download), over the DevTools protocol.

1. Lesson 00's deck, opened from disk with every host name unresolvable: reveal.js starts, the right
   arrow key and `Reveal.next()` step through the slides, and nothing outside the deck's folder is
   requested.
1b. Every course deck, built from this session's executed notebooks (outputs and plots, as
   `m11 course` builds them) where fresh: on no slide is a line of code or output cut at an edge
   (tests/support/decks.py), proven able to fail on a deck whose wrapping is switched off.
2. JupyterLab on a free port with a known token: RISE typesets a formula; open the ZeRO memory lab,
   *Run ▸ Run All Cells* from the menu, drag the "GPUs (N)" slider, and see the plot and the summary
   change. JupyterLab 4 renders only the cells in view (windowing): a plot below the fold is not in
   the page at all, so the test scrolls to it as a reader would — with a setup cell five lines
   longer the old test failed every time on that alone, and a cold first layout at the edge of the
   viewport fails it the same way now and then. It waits on the kernel's progress (cell by cell,
   failing on a stall and naming the cell), not on a fixed clock, warms matplotlib's font cache as
   set-up does, and prints how long each phase took.

Screenshots go to build/test-artifacts/browser/. Both tests skip, saying why, without Chromium.
The lab test opens a copy of course/05_zero_fsdp.ipynb cut to its title, setup and lab cells (the
whole lesson takes over a minute on 2 cores); M11_BROWSER_FULL=1 opens and runs the whole lesson.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from m11_helpers.tools.assets import assets_dir, installed
from m11_helpers.tools.slides import build_deck
from support.browser import Chromium, JupyterLab, find_chromium, wait_for, wait_for_cells, warm_font_cache
from support.deck_fit import fit_deck
from support.decks import MEASURE as MEASURE_ONE
from support.decks import SETUP as SETUP_SLIDES
from support.decks import deck_sources, measure_deck

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "build" / "test-artifacts" / "browser"
LESSON_00 = REPO / "course" / "00_welcome.ipynb"
ZERO_LESSON = REPO / "course" / "05_zero_fsdp.ipynb"
FULL = os.environ.get("M11_BROWSER_FULL") == "1"

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="Chromium is not installed: `apt-get install -y chromium` (.ci/run does), or set M11_CHROMIUM",
)
needs_assets = pytest.mark.skipif(
    not installed(assets_dir()),
    reason=f"slide assets not in {assets_dir()}: run `.venv/bin/python -m m11_helpers.tools.assets`",
)

# reveal.js is an AMD module under require.js (no global `Reveal`): reach it through require
REVEAL = "new Promise(ok => require(['_assets/reveal.js/dist/reveal.js'], R => ok(R.{call})))"


# ------------------------------------------------------------------------------------------------
# 1. a deck, offline, from disk
# ------------------------------------------------------------------------------------------------


@needs_assets
def test_lesson_00_deck_steps_through_slides_offline(tmp_path: Path) -> None:
    deck = build_deck(LESSON_00, tmp_path / "slides")
    shots = ARTIFACTS / "deck"
    shutil.rmtree(shots, ignore_errors=True)
    with Chromium(offline=True) as page:
        page.goto(deck.as_uri())
        wait_for(lambda: page.evaluate(REVEAL.format(call="isReady()")), 30, "reveal.js to initialise")
        total = page.evaluate(REVEAL.format(call="getTotalSlides()"))
        assert total > 3, f"lesson 00's deck has only {total} slides"
        indices = lambda: page.evaluate(REVEAL.format(call="getIndices()"))  # noqa: E731
        assert indices() == {"h": 0, "v": 0}
        assert "WELCOME" in page.evaluate("document.querySelector('.slides section').innerText").upper()
        page.screenshot(shots / "slide-00.png")

        seen = [indices()]
        page.key("ArrowRight", key_code=39)  # as a presenter would: the keyboard
        wait_for(lambda: indices() != seen[0], 10, "the right arrow key to change the slide")
        seen.append(indices())
        time.sleep(0.8)  # let the slide transition finish before the picture
        page.screenshot(shots / "slide-01.png")
        for n in range(2, 5):  # and through the API a remote control would use
            page.evaluate(REVEAL.format(call="next()"))
            wait_for(lambda: indices() != seen[-1], 10, "Reveal.next() to change the slide")
            seen.append(indices())
            time.sleep(0.8)
            page.screenshot(shots / f"slide-{n:02d}.png")
        # each step shows something new (a slide, or the next fragment of one), never goes back
        steps = [(i["h"], i["v"], i.get("f", -1)) for i in seen]
        assert steps == sorted(set(steps)), f"a step repeated or went back: {seen}"
        slides = sorted({(h, v) for h, v, _ in steps})
        assert len(slides) >= 3, f"five steps crossed only {slides}"
        # reveal agrees we moved on (the arrow key skips a vertical sub-slide, so it may count more)
        assert page.evaluate(REVEAL.format(call="getSlidePastCount()")) >= len(slides) - 1
        assert page.evaluate(REVEAL.format(call="getCurrentSlide().innerText.trim().length")) > 0

        remote = [u for u in page.requests() if not u.startswith(("file:", "data:", "blob:", "about:"))]
        assert remote == [], f"the deck asked the network for {remote}"
        assert page.failed_requests() == [], f"missing files: {page.failed_requests()}"
        assert page.evaluate("document.querySelector('.slides').innerText").count("Traceback") == 0


UNWRAPPED = """const s = document.createElement('style'); document.head.appendChild(s);
s.textContent = '.reveal div.highlight > pre { white-space: pre !important; overflow: visible !important } '
  + '.reveal .jp-OutputArea-output { overflow: visible !important; max-height: none !important }';"""


@needs_assets
@pytest.mark.slow
@pytest.mark.after_course  # runs after the course notebooks, whose executed copies it presents
def test_every_slide_of_every_deck_fits_the_screen_in_height_and_width(tmp_path: Path) -> None:
    """Each slide at 1280 × 720 as presented, all fragments shown: not taller than the slide (a slide that
    scrolls does not fit) and no code, output, table or formula wider than its box or past the edge."""
    long = "x = " + " + ".join(f"value_{i}" for i in range(40))  # ~400 characters of code
    probe = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Wide lines"),
                                            nbformat.v4.new_code_cell(long)])
    probe.cells[1].outputs = [nbformat.v4.new_output("stream", text="-" * 400 + "\n")]  # wraps in its box
    table = "<table><tr>" + "".join(f"<td>column_{i}</td>" for i in range(40)) + "</tr></table>"  # cannot wrap
    probe.cells[1].outputs.append(nbformat.v4.new_output("display_data", data={"text/html": table}))
    tall = nbformat.v4.new_markdown_cell("\n".join(f"- line {i}" for i in range(60)))
    tall.metadata["slideshow"] = {"slide_type": "slide"}
    short = nbformat.v4.new_markdown_cell("## A slide that fits")
    short.metadata["slideshow"] = {"slide_type": "slide"}
    probe.cells += [tall, short]
    nbformat.write(probe, tmp_path / "wide.ipynb")
    sources = deck_sources()
    decks = {stem: build_deck(path, tmp_path / "slides") for stem, (path, _) in sources.items()}
    wide = build_deck(tmp_path / "wide.ipynb", tmp_path / "slides")
    reports = {}
    with Chromium(offline=True, width=1280, height=720) as page:
        assert measure_deck(page, wide)["cut"] == [], "a 400-character line must wrap / scroll in its box"
        # the fit measure sees what the lenient one lets through: the 40-column table scrolls in its box (too
        # wide), the 60-line slide is too tall though it scrolls; the wrapped 400-character lines fit
        fit = fit_deck(page, wide)
        assert [s for s, _ in fit["wide"]] == ["0.0"] and [s for s, _ in fit["tall"]] == ["1.0"], fit
        assert all(what[0][0] == "TABLE" for _, what in fit["wide"]), fit  # not the wrapped code or output
        page.evaluate(UNWRAPPED)  # the control: the same deck, still open, with our wrapping switched off
        cut = [c for h, v in page.evaluate(SETUP_SLIDES) for c in page.evaluate(MEASURE_ONE % (h, v))["cut"]]
        assert cut, "the measurement must see a line cut at the edge when wrapping is off"
        for stem, deck in decks.items():
            reports[stem] = fit_deck(page, deck)
    executed = [s for s, (_, ran) in sources.items() if ran]
    summary = {s: (r["slides"], r["misfits"], r["images"]) for s, r in reports.items()}
    print(f"\ndecks (slides, slides that do not fit, plots): {summary}; from executed notebooks: {executed}")
    assert all(r["slides"] > 3 for r in reports.values()), summary
    bad = {s: {"tall (slide, px)": r["tall"][:4], "wide (slide, boxes)": r["wide"][:2]}
           for s, r in reports.items() if r["misfits"]}
    assert not bad, f"slides that do not fit 1280 × 720 (tests/support/deck_fit.py --lesson NN lists all): {bad}"
    for stem in executed:  # a deck built from an executed notebook shows its plots
        nb = nbformat.read(sources[stem][0], as_version=4)
        plots = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
        assert reports[stem]["images"] >= min(plots, 1), (stem, plots, reports[stem]["images"])


# ------------------------------------------------------------------------------------------------
# 2. the ZeRO memory lab in JupyterLab, driven by the mouse
# ------------------------------------------------------------------------------------------------

FIXTURE_LAB = '''\
import io
import ipywidgets as w
import matplotlib.pyplot as plt

gpus, summary, plot = w.IntSlider(value=8, min=1, max=1024, description="GPUs (N)"), w.HTML(), w.Image(format="png")

def redraw(_change=None):
    summary.value = f"<b>memory</b> on {gpus.value} GPUs"
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"], [16, 4 + 12 / gpus.value, 2 + 14 / gpus.value, 16 / gpus.value])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    plot.value = buf.getvalue()

gpus.observe(redraw, names="value")
redraw()
w.VBox([gpus, summary, plot]).add_class("m11-lab")'''


def lab_notebook(course: Path) -> tuple[str, int]:
    """Write the notebook to open into course/; return its name and its number of code cells.

    The lesson's own lab when 05_zero_fsdp.ipynb calls `memory_lab`, else a fixture with the same
    shape (an IntSlider "GPUs (N)" redrawing a summary (HTML) and a matplotlib plot (Image))."""
    if ZERO_LESSON.is_file():
        nb = nbformat.read(ZERO_LESSON, as_version=4)
        lab = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "memory_lab(" in c.source]
        if lab and FULL:
            return ZERO_LESSON.name, sum(c.cell_type == "code" for c in nb.cells)
        if lab:
            setup = [c for c in nb.cells[: lab[0]] if c.cell_type == "code" and "setup(" in c.source]
            # the lesson's import cells before the lab (where `memory_lab` comes from)
            setup += [c for c in nb.cells[: lab[0]] if c.cell_type == "code" and c not in setup and all(
                not line.strip() or line.lstrip().startswith(("import ", "from ", "#")) for line in c.source.splitlines())]
            heading = nb.cells[lab[0] - 1] if nb.cells[lab[0] - 1].cell_type == "markdown" else None
            nb.cells = [nb.cells[0], *setup, nbformat.v4.new_code_cell("from m11_helpers import zero"),
                        *([heading] if heading else []), nb.cells[lab[0]]]
            nbformat.write(nb, course / "05_zero_fsdp_lab.ipynb")
            return "05_zero_fsdp_lab.ipynb", sum(c.cell_type == "code" for c in nb.cells)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Memory lab (fixture)"),
                                         nbformat.v4.new_code_cell(FIXTURE_LAB)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, course / "lab_fixture.ipynb")
    return "lab_fixture.ipynb", 1


NOTEBOOK_READY = """(() => document.querySelectorAll('.jp-Notebook .jp-Cell').length > 0
    && !/No Kernel/.test(document.querySelector('.jp-NotebookPanel-toolbar')?.textContent ?? 'No Kernel')
    && document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle')()"""

# the lab's visible state: the slider's readout, the summary line, and the plot as drawn (a digest of its pixels:
# the Image widget's src is a fresh blob: URL at every update, whatever the picture)
LAB_STATE = """(() => {
    const box = document.querySelector('.m11-lab'); if (!box) return null;
    const slider = [...box.querySelectorAll('.widget-slider')]
        .find(e => e.querySelector('.widget-label')?.textContent.trim() === 'GPUs (N)');
    if (!slider) return null;
    slider.querySelector('.noUi-handle').setAttribute('data-m11-test', 'gpus');
    const img = box.querySelector('img.widget-image');
    let png = '';
    if (img && img.complete && img.naturalWidth > 0) {
        const c = document.createElement('canvas');
        [c.width, c.height] = [img.naturalWidth, img.naturalHeight];
        c.getContext('2d').drawImage(img, 0, 0);
        const d = c.toDataURL('image/png');
        let h = 0;
        for (let i = 0; i < d.length; i++) h = (h * 31 + d.charCodeAt(i)) | 0;
        png = `${img.naturalWidth}x${img.naturalHeight}:${h}`;
    }
    return {readout: slider.querySelector('.widget-readout').textContent.trim(), img: png,
            summary: box.querySelector('.widget-html-content')?.innerText ?? ''};
})()"""
# what the notebook shows when the lab is not as expected: the lab's parts and every output (an error, a warning)
LAB_DIAGNOSIS = """(() => {
    const box = document.querySelector('.m11-lab'), img = box?.querySelector('img');
    return {lab: !!box, widgets: box ? box.children.length : 0,
            img: img ? {src: img.src.slice(0, 30), complete: img.complete, width: img.naturalWidth} : null,
            outputs: [...document.querySelectorAll('.jp-OutputArea-output')]
                .map(e => `${e.dataset.mimeType ?? ''}: ${e.innerText.slice(0, 300)}`)};
})()"""


@pytest.mark.slow
def test_zero_memory_lab_runs_in_jupyterlab_and_slider_redraws(tmp_path: Path) -> None:
    course = tmp_path / "course"
    shutil.copytree(REPO / "course", course, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    name, code_cells = lab_notebook(course)
    shots = ARTIFACTS / "lab"
    shutil.rmtree(shots, ignore_errors=True)
    slow = 4 if FULL else 1
    timings = {"font cache": warm_font_cache()}  # what set-up does (Makefile); a no-op when warm
    math = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# Math\n\n$\\nabla L = \\frac{1}{N}\\sum_i \\nabla L_i$")])
    math.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(math, course / "math.ipynb")
    start = time.monotonic()
    with JupyterLab(course) as lab, Chromium(offline=True, height=900) as page:
        timings["server"] = round(time.monotonic() - start, 1)
        # RISE (jupyterlab-rise) shows a notebook as slides; its math must typeset (JupyterLab's MathJax 3)
        page.goto(lab.url("rise/math.ipynb"), timeout=90)
        wait_for(lambda: page.evaluate("document.querySelectorAll('.jp-RenderedMarkdown mjx-container').length"),
                 60, "RISE to typeset the formula")
        timings["rise math"] = round(time.monotonic() - start, 1)
        page.goto(lab.url(f"lab/tree/{name}"), timeout=90)
        wait_for(lambda: page.evaluate(NOTEBOOK_READY), 90, f"{name} to open with an idle kernel")
        timings["opened"] = round(time.monotonic() - start, 1)
        page.screenshot(shots / "01-opened.png")

        page.click("li.lm-MenuBar-item", "Run")  # Run ▸ Run All Cells, with the mouse
        run_all = '.lm-Menu-item[data-command="runmenu:run-all"]'
        wait_for(lambda: page.evaluate(f"!!document.querySelector('{run_all}')"), 10, "the Run menu to open")
        page.click(run_all)

        def settled():
            # Bring the lab into view as a reader would scroll to it (and the screenshots then show it; with
            # windowing off, JupyterLab renders it wherever it is, so this is for the pictures and the drag)
            page.evaluate("document.querySelector('.m11-lab')?.scrollIntoView({block: 'center'})")
            state = page.evaluate(LAB_STATE)
            return state if state and state["img"] and state["summary"] else None

        # Wait on the kernel's progress, not on a fixed clock: a cold or loaded 2-core machine spends
        # tens of seconds in the setup cell's imports (torch, matplotlib's font cache on a fresh
        # machine) before the lab cell even starts. Fail on a stall, saying which cell it was in.
        done = wait_for_cells(page, code_cells, stall=120 * slow, limit=400 * slow)
        timings["cells"] = done
        try:
            before = wait_for(settled, 30, f"the lab's plot to appear once every cell ran (cells: {done})")
        except TimeoutError as e:
            page.screenshot(shots / "02-no-plot.png")
            raise TimeoutError(f"{e}\nthe notebook shows: {page.evaluate(LAB_DIAGNOSIS)}\n"
                               f"JupyterLab's log ends: {lab.log.read_text()[-2000:]}") from None
        wait_for(lambda: page.evaluate(NOTEBOOK_READY), 30 * slow, "the kernel to finish")
        prompts = page.evaluate("[...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                                ".map(e => e.textContent.trim())")
        # every code cell ran: a number in its prompt, none left at [*] or [ ]
        assert len(prompts) == code_cells and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), prompts
        errors = page.evaluate("[...document.querySelectorAll('.jp-OutputArea-output[data-mime-type*=error]')]"
                               ".map(e => e.innerText.slice(0, 300))")
        assert errors == [], f"a cell failed: {errors}"
        assert f"on {before['readout']} GPUs" in before["summary"], before["summary"]
        page.screenshot(shots / "02-ran-all.png")

        page.drag('[data-m11-test="gpus"]', 40)  # a user dragging the slider's handle to the right

        def redrawn():
            now = settled()
            return now if (now and now["readout"] != before["readout"]
                           and f"on {now['readout']} GPUs" in now["summary"]) else None

        after = wait_for(redrawn, 30, "the plot to follow the slider")
        page.screenshot(shots / "03-slider-moved.png")
        assert int(after["readout"]) > int(before["readout"])
        assert after["img"] != before["img"], "the slider moved but the plot did not change"
    print(f"\nJupyterLab lab test, seconds since start: {timings}")

