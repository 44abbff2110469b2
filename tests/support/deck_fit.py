"""Does every slide fit an instructor's screen? Each slide of a deck measured at 1280 × 720, as presented.

    report = fit_deck(page, deck)        # {"slides": n, "tall": [...], "wide": [...]} for one deck
    python tests/support/deck_fit.py                  # every course deck: counts per lesson
    python tests/support/deck_fit.py --lesson 05      # one deck, with each misfit slide and why

A deck is built from the lesson's executed copy when `make test-lesson N=NN` (nbval) left a fresh one in
build/test-artifacts/executed, else from the stored notebook (checked outputs only): execute first.

A slide does not fit when it is taller than the slide box (its content needs the scroll bar the deck
template gives it: scrolling counts as not fitting) or when it holds something wider than its box: a
code or output box whose content is wider than the box, whether it wraps, scrolls sideways or is cut,
or any element reaching past the slide's right edge. Every fragment is shown before measuring. This
is stricter than tests/support/decks.py's MEASURE, which fails only what is lost (cut, not scrolled).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: tests/ on sys.path, as pytest has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.decks import REVEAL, SETUP, deck_sources  # noqa: E402

# one slide, all fragments shown, two frames for layout and MathJax: its height overflow and what is too wide
FIT = """new Promise(ok => { M11R.slide(%d, %d, 1e6);
  requestAnimationFrame(() => requestAnimationFrame(() => {
    const s = M11R.getCurrentSlide(), edge = s.getBoundingClientRect().right + 1, wide = [];
    const text = e => (e.innerText || '').trim().split('\\n')[0].slice(0, 60);
    for (const e of s.querySelectorAll('pre, .highlight, .jp-InputArea-editor, .jp-OutputArea-output, table')) {
      if (e.scrollWidth - e.clientWidth > 1) wide.push([e.tagName, e.scrollWidth, e.clientWidth, text(e)]);
    }
    for (const e of s.querySelectorAll('pre, img, svg, table, mjx-container, p, li')) {
      const r = e.getBoundingClientRect();
      if (r.width > 0 && r.right > edge) wide.push(['past the edge: ' + e.tagName, Math.round(r.right), Math.round(edge), text(e)]);
    }
    ok({over: Math.max(0, s.scrollHeight - s.clientHeight), height: s.clientHeight, wide: wide,
        images: s.querySelectorAll('.jp-OutputArea-output img').length});
  })); })"""


def fit_deck(page, deck: Path) -> dict:
    """Every slide of deck (opened in page, a support.browser.Chromium of 1280 × 720) measured for fit.

    {"slides": n, "tall": [(slide, px over)], "wide": [(slide, boxes)], "misfits": slides in either, "images": plots}
    """
    from support.browser import wait_for

    page.goto(deck.as_uri())
    wait_for(lambda: page.evaluate(f"typeof require === 'function' && new Promise(ok => require(['{REVEAL}'], "
                                   "R => ok(R.isReady())))"), 30, f"{deck.name}'s reveal.js to initialise")
    slides = page.evaluate(SETUP)
    report: dict = {"slides": len(slides), "tall": [], "wide": [], "images": 0}
    for h, v in slides:
        got = page.evaluate(FIT % (h, v))
        report["images"] += got["images"]
        if got["over"] > 1:
            report["tall"].append((f"{h}.{v}", got["over"]))
        if got["wide"]:
            report["wide"].append((f"{h}.{v}", got["wide"][:3]))
    report["misfits"] = len({s for s, _ in report["tall"]} | {s for s, _ in report["wide"]})
    return report


def main(argv: list[str] | None = None) -> int:
    from m11_helpers.tools.slides import build_deck
    from support.browser import Chromium

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lesson", help="two-digit lesson number: that deck only, every misfit listed")
    args = parser.parse_args(argv)
    sources = {k: v for k, v in deck_sources().items() if args.lesson is None or k.startswith(args.lesson + "_")}
    if not sources:
        parser.error(f"--lesson {args.lesson!r}: no course notebook starts with it")
    total = {"slides": 0, "misfits": 0}
    with tempfile.TemporaryDirectory() as tmp, Chromium(offline=True, width=1280, height=720) as page:
        print(f"{'lesson':<30} {'slides':>6} {'tall':>5} {'wide':>5} {'misfit':>6}  from")
        for stem, (path, ran) in sources.items():
            r = fit_deck(page, build_deck(path, Path(tmp)))
            total["slides"] += r["slides"]
            total["misfits"] += r["misfits"]
            print(f"{stem:<30} {r['slides']:>6} {len(r['tall']):>5} {len(r['wide']):>5} {r['misfits']:>6}  "
                  f"{'executed' if ran else 'stored'}")
            if args.lesson is not None:
                for slide, over in r["tall"]:
                    print(f"  slide {slide}: {over} px taller than the slide")
                for slide, what in r["wide"]:
                    print(f"  slide {slide}: too wide: {what}")
    print(f"{'total':<30} {total['slides']:>6} {'':>5} {'':>5} {total['misfits']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
