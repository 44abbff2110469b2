"""`m11 slides`: one offline reveal.js deck per course notebook, plus an index page.

    m11 slides [NOTEBOOK...] [--out build/slides] [--execute] [--cdn]

Cells' `metadata.slideshow.slide_type` (slide, subslide, fragment, -, skip, notes) shape the deck;
`notes` cells become speaker notes (press `s`). Every asset is a relative link into
`<out>/_assets/`, copied from the cache that `python -m m11_helpers.tools.assets` fills at set-up, so the
folder can be zipped and opened from disk with no network. Without that cache (no npm at set-up),
`--cdn` links the same pinned versions from a CDN instead (the deck then needs a network to show).

A deck shows what a presenter shows: nbval's `# NBVAL_...` marker lines are dropped, and a code
cell tagged `m11-output-only` (code that only formats a table or styles a plot) shows its output
alone. Code lines wrap and long outputs scroll inside their box, so nothing is cut at the slide's
edge (tests/test_browser.py measures every slide of every deck).
"""

from __future__ import annotations

import argparse
import functools
import html
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat

from m11_helpers.tools.assets import PACKAGES, assets_dir, installed
from m11_helpers.tools.paths import NotInRepository, repo_root

TEMPLATES = Path(__file__).parent / "templates"
ASSETS = "_assets"  # folder next to the decks; all decks share it
CELL_TIMEOUT_S = 300  # per cell, for --execute: a lesson runs in under 60 s on 2 cores
HEADING = re.compile(r"^\s*#{1,6}\s+(.+?)\s*#*\s*$", re.M)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
OUTPUT_ONLY_TAG = "m11-output-only"  # a formatting-only cell: the deck shows its output, not its code
NBVAL_MARKER = re.compile(r"^[ \t]*#[ \t]*(?:NBVAL|PYTEST_VALIDATE)_[A-Z_]+[ \t]*(?:\n|$)", re.M)
CDN = "https://cdn.jsdelivr.net/npm"  # --cdn: the same pinned versions as the offline cache


def asset_urls(cdn: bool = False) -> dict[str, str]:
    """Where a deck loads reveal.js (a folder), MathJax and require.js (files) from."""
    if cdn:
        return {"reveal": f"{CDN}/reveal.js@{PACKAGES['reveal.js']}",
                "mathjax": f"{CDN}/mathjax@{PACKAGES['mathjax']}/es5/tex-chtml-full.js",
                "require": f"{CDN}/requirejs@{PACKAGES['requirejs']}/require.js"}
    return {"reveal": f"{ASSETS}/reveal.js", "mathjax": f"{ASSETS}/mathjax/tex-chtml-full.js",
            "require": f"{ASSETS}/require.js/require.js"}


def deck_title(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The first Markdown heading of the notebook, without its #s; else fallback."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and (match := HEADING.search(cell.source)):
            return match.group(1)
    return fallback


def _link_or_copy(src: str, dst: str) -> None:
    # a hard link costs no space; across file systems it is refused and we copy
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def install_assets(out_dir: Path) -> Path:
    """Copy (hard-link) the cached assets into out_dir/_assets unless the same versions are there."""
    cache = assets_dir()
    if not installed(cache):
        raise FileNotFoundError(
            f"slide assets are missing from {cache}: run `{sys.executable} -m m11_helpers.tools.assets` "
            "once (it needs npm and a network; the decks then need neither), set M11_ASSETS to a folder "
            "that holds them, or build decks that load them from a CDN: `m11 slides --cdn`"
        )
    target = out_dir / ASSETS
    if not installed(target):
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(cache, target, copy_function=_link_or_copy)
    return target


def _strip_widgets(nb: nbformat.NotebookNode) -> None:
    """Drop widget state and views: rendering them needs the HTML manager from a CDN."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if WIDGET_VIEW in out.get("data", {}):
                out.data = {"text/html": "<p><em>(interactive widget: open the notebook to use "
                                         "it)</em></p>"}


def presenter_view(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What a presenter shows: no nbval marker lines; `m11-output-only` cells lose their code on the slide.

    Modifies nb in place (a copy read for the deck) and returns it."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source = NBVAL_MARKER.sub("", cell.source)
        if OUTPUT_ONLY_TAG in cell.metadata.get("tags", []):
            # nbconvert's templates skip the input of such a cell (what its TagRemovePreprocessor sets)
            cell.metadata["transient"] = {"remove_source": True}
    return nb


def _execute(nb: nbformat.NotebookNode, folder: Path) -> None:
    """Run nb in place with its folder as cwd, so relative data paths and plots work."""
    # imported late: only --execute needs a kernel
    from nbclient.exceptions import CellControlSignal, DeadKernelError

    from m11_helpers.tools.kernels import notebook_client

    kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
    client = notebook_client(nb, cwd=folder, timeout=CELL_TIMEOUT_S, kernel_name=kernel)
    try:
        client.execute()
    except (CellControlSignal, DeadKernelError) as err:  # a failing cell, a timeout, a crash
        raise RuntimeError(f"executing a notebook in {folder} failed:\n{err}") from err


@functools.cache
def _exporter(cdn: bool = False):
    """nbconvert's reveal.js exporter on our template (one per mode: loading the templates costs a second)."""
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    urls = asset_urls(cdn)  # offline: relative to the deck, which sits next to _assets/
    c = Config()
    c.SlidesExporter.extra_template_basedirs = [str(TEMPLATES)]
    c.SlidesExporter.template_name = "m11_reveal"
    c.SlidesExporter.reveal_url_prefix = urls["reveal"]
    c.SlidesExporter.reveal_theme = "white"  # a theme whose fonts ship with reveal.js
    c.SlidesExporter.reveal_transition = "slide"
    c.SlidesExporter.reveal_number = "c/t"
    c.SlidesExporter.reveal_scroll = False  # our template makes a too-tall slide scroll (no jQuery)
    # 16:9 at 1280 px: a 100-character code line fits at the template's 16 px; reveal scales to the screen
    c.SlidesExporter.reveal_width = "1280"
    c.SlidesExporter.reveal_height = "720"
    c.SlidesExporter.mathjax_url = urls["mathjax"]
    c.SlidesExporter.require_js_url = urls["require"]
    # unused by our template; emptied so that no CDN address can come back through a parent block
    # (only those this nbconvert lets a config set: the others would log "not recognized")
    settable = set(SlidesExporter.class_trait_names(config=True))
    for name in ("jquery_url", "mermaid_js_url", "mermaid_layout_elk_js_url", "jupyter_widgets_base_url",
                 "widget_renderer_url"):
        if name in settable:
            c.SlidesExporter[name] = ""
    return SlidesExporter(config=c)


def build_deck(notebook_path: str | Path, out_dir: str | Path, execute: bool = False, cdn: bool = False) -> Path:
    """Write out_dir/<stem>.slides.html (and out_dir/_assets/ unless cdn) and return the deck's path."""
    nb_path, out = Path(notebook_path), Path(out_dir)
    if nb_path.suffix != ".ipynb" or not nb_path.is_file():
        raise ValueError(f"notebook_path={str(nb_path)!r}: not an existing .ipynb file")
    if not cdn:
        install_assets(out)  # raises, saying what to run, before any work
    out.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(nb_path, as_version=4)
    if execute:
        _execute(nb, nb_path.parent.resolve())
    _strip_widgets(nb)
    presenter_view(nb)
    nb.metadata.setdefault("title", deck_title(nb, nb_path.stem))
    body, _ = _exporter(cdn).from_notebook_node(nb, resources={"metadata": {"name": nb_path.stem}})
    deck = out / f"{nb_path.stem}.slides.html"
    deck.write_text(body, encoding="utf-8")
    _copy_local_files(body, nb_path.parent, out)
    return deck


def _copy_local_files(body: str, src_dir: Path, out: Path) -> None:
    """Copy files a Markdown cell links to (an image beside the notebook) next to the deck."""
    for ref in re.findall(r"""<(?:img|source|a)\b[^>]*?\b(?:src|href)=["']([^"'#?]+)""", body):
        if re.match(r"^([a-z][a-z0-9+.-]*:|/|#)", ref, re.I) or ref.startswith(ASSETS):
            continue  # remote, data:, absolute, anchor or ours
        src = (src_dir / ref).resolve()
        if src.is_file() and src.is_relative_to(src_dir.resolve()):
            (out / ref).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out / ref)


def write_index(out_dir: Path) -> Path:
    """out_dir/index.html: a link to every deck there, titled as the deck is (first heading)."""
    rows = []
    for deck in sorted(out_dir.glob("*.slides.html")):
        found = re.search(r"<title>(.*?) slides</title>", deck.read_text(encoding="utf-8"), re.S)
        title = html.unescape(found.group(1).strip()) if found else deck.stem
        rows.append(f'  <li><a href="{html.escape(deck.name)}">{html.escape(title)}</a></li>')
    items = "\n".join(rows)
    page = out_dir / "index.html"
    page.write_text(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">"
        "<title>M11 · Training at Scale: slides</title>\n<style>body{font-family:sans-serif;"
        "max-width:40em;margin:3em auto;line-height:1.6}</style></head>\n<body>\n"
        "<h1>M11 · Training at Scale: slides</h1>\n<p>Press <kbd>s</kbd> in a deck for speaker "
        f"notes, <kbd>Esc</kbd> for the overview.</p>\n<ol>\n{items}\n</ol>\n</body>\n</html>\n",
        encoding="utf-8")
    return page


def build_decks(notebooks: list[Path], out: Path, execute: bool = False, cdn: bool = False) -> list[Path]:
    """One deck per notebook into out/, then out/index.html; return the decks' paths."""
    decks = [build_deck(nb_path, out, execute=execute, cdn=cdn) for nb_path in notebooks]
    write_index(out)
    return decks


def main(argv: list[str] | None = None) -> int:
    """`m11 slides`: 0 when every deck was written, 1 when one could not be (missing assets, a failed
    --execute), 2 on a usage mistake (bad flag, no notebooks, outside the repository without any)."""
    parser = argparse.ArgumentParser(prog="m11 slides", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to build (default: every course/*.ipynb of the repository)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: build/slides in the repository, else ./slides)")
    parser.add_argument("--execute", action="store_true", help="run each notebook first")
    parser.add_argument("--cdn", action="store_true",
                        help="load reveal.js and MathJax from a CDN (no offline assets needed; the deck needs a network)")
    args = parser.parse_args(argv)
    try:
        root = repo_root()
    except NotInRepository:
        if not args.notebooks:
            raise  # `m11` says so and exits 2
        root = None
    notebooks = args.notebooks or sorted((root / "course").glob("[0-9][0-9]_*.ipynb"))
    out = args.out or (root / "build" / "slides" if root else Path("slides"))
    missing = [str(p) for p in notebooks if p.suffix != ".ipynb" or not p.is_file()]
    if not notebooks or missing:
        print(f"m11 slides: {'not existing .ipynb files: ' + ', '.join(missing) if missing else 'no notebooks'}",
              file=sys.stderr)
        return 2
    try:
        for deck in build_decks(notebooks, out, execute=args.execute, cdn=args.cdn):
            print(deck)
    except (FileNotFoundError, RuntimeError) as err:
        print(f"m11 slides: {err}", file=sys.stderr)
        return 1
    print(out / "index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
