"""`m11 slides`: one offline reveal.js deck per course notebook, plus an index page.

    m11 slides [NOTEBOOK...] [--out build/slides] [--execute]

Cells' `metadata.slideshow.slide_type` (slide, subslide, fragment, -, skip, notes) shape the deck;
`notes` cells become speaker notes (press `s`). Every asset is a relative link into
`<out>/_assets/`, copied from the cache that `python -m m11_helpers.tools.assets` fills at set-up, so the
folder can be zipped and opened from disk with no network.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat

from m11_helpers.tools.assets import assets_dir, installed
from m11_helpers.tools.paths import repo_root

TEMPLATES = Path(__file__).parent / "templates"
ASSETS = "_assets"  # folder next to the decks; all decks share it
CELL_TIMEOUT_S = 300  # per cell, for --execute: a lesson runs in under 60 s on 2 cores
HEADING = re.compile(r"^\s*#{1,6}\s+(.+?)\s*#*\s*$", re.M)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


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
            f"slide assets are missing from {cache}: run `.venv/bin/python -m m11_helpers.tools.assets` "
            "once (it needs npm and a network; the decks then need neither), or set M11_ASSETS "
            "to a folder that holds them"
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


def _execute(nb: nbformat.NotebookNode, folder: Path) -> None:
    """Run nb in place with its folder as cwd, so relative data paths and plots work."""
    # imported late: only --execute needs a kernel
    from nbclient import NotebookClient
    from nbclient.exceptions import CellControlSignal, DeadKernelError

    kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=kernel,
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()
    except (CellControlSignal, DeadKernelError) as err:  # a failing cell, a timeout, a crash
        raise RuntimeError(f"executing a notebook in {folder} failed:\n{err}") from err


def _exporter():
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    prefix = ASSETS  # relative to the deck, which sits next to _assets/
    c = Config()
    c.SlidesExporter.extra_template_basedirs = [str(TEMPLATES)]
    c.SlidesExporter.template_name = "m11_reveal"
    c.SlidesExporter.reveal_url_prefix = f"{prefix}/reveal.js"
    c.SlidesExporter.reveal_theme = "white"  # a theme whose fonts ship with reveal.js
    c.SlidesExporter.reveal_transition = "slide"
    c.SlidesExporter.reveal_number = "c/t"
    c.SlidesExporter.reveal_scroll = False
    c.SlidesExporter.mathjax_url = f"{prefix}/mathjax/tex-chtml-full.js"
    c.SlidesExporter.require_js_url = f"{prefix}/require.js/require.js"
    # unused by our template; set so that no CDN address can come back through a parent block
    c.SlidesExporter.jquery_url = ""
    c.SlidesExporter.mermaid_js_url = ""
    c.SlidesExporter.mermaid_layout_elk_js_url = ""
    c.SlidesExporter.jupyter_widgets_base_url = ""
    c.SlidesExporter.widget_renderer_url = ""
    return SlidesExporter(config=c)


def build_deck(notebook_path: str | Path, out_dir: str | Path, execute: bool = False) -> Path:
    """Write out_dir/<stem>.slides.html (and out_dir/_assets/) and return the deck's path."""
    nb_path, out = Path(notebook_path), Path(out_dir)
    if nb_path.suffix != ".ipynb" or not nb_path.is_file():
        raise ValueError(f"notebook_path={str(nb_path)!r}: not an existing .ipynb file")
    out.mkdir(parents=True, exist_ok=True)
    install_assets(out)
    nb = nbformat.read(nb_path, as_version=4)
    if execute:
        _execute(nb, nb_path.parent.resolve())
    _strip_widgets(nb)
    nb.metadata.setdefault("title", deck_title(nb, nb_path.stem))
    body, _ = _exporter().from_notebook_node(nb, resources={"metadata": {"name": nb_path.stem}})
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="m11 slides", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to build (default: every course/*.ipynb of the repo)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (build/slides)")
    parser.add_argument("--execute", action="store_true", help="run each notebook first")
    args = parser.parse_args(argv)
    try:
        root = repo_root() if not args.notebooks or args.out is None else Path.cwd()
        notebooks = args.notebooks or sorted((root / "course").glob("*.ipynb"))
        out = args.out or root / "build" / "slides"
        if not notebooks:
            raise ValueError(f"notebooks: none given and none in {root / 'course'}")
        for nb_path in notebooks:
            print(build_deck(nb_path, out, execute=args.execute))
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"m11 slides: {err}", file=sys.stderr)
        return 1
    print(write_index(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
