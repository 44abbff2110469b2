"""`m11 site`: the course as a static website, every lesson with its outputs and plots, built offline.

    m11 site [--executed DIR] [--out build/site]        # then open build/site/index.html

Each lesson page comes from the executed notebook in DIR (default build/executed, what `m11 course`
writes; the test suite passes the copies its notebook run kept) when it is complete and its code is the
lesson's current code, else from the stored notebook (its checked outputs only; said so). Pages:
lessons/ (tools/site_pages.py: no speaker notes, widgets explained, badges and links), exercises/
(statements only), slides/ (the decks without speaker notes), a table of contents in lesson order,
Sphinx's own full-text search, MathJax 3 from the local copy set-up fetched (tools/assets.py).

Why Sphinx + MyST-NB (the `[site]` extra): it renders executed notebooks with execution off, its theme
(alabaster) and search ship inside the Python packages, and `mathjax_path` takes a local file, so the
build and the pages need no network. Jupyter Book 2 (mystmd) was not chosen: it is a Node tool whose
site themes are downloaded from GitHub at the first build (myst-theme's template.yml, fetched by
`myst build --html`), which neither this project's machines nor an offline classroom can reach.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from m11_helpers.tools.assets import assets_dir, assets_hint, installed
from m11_helpers.tools.paths import repo_root
from m11_helpers.tools.site_pages import deck_view, exercise_page, lesson_page
from m11_helpers.tools.slides import build_deck, deck_title, write_index

__all__ = ["sources", "build_site", "main"]

TEMPLATE = Path(__file__).parent / "templates" / "site"


def _code(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def sources(root: Path, executed: Path) -> dict[str, tuple[Path, bool]]:
    """{stem: (notebook a lesson page is built from, executed?)} in lesson order.

    An executed copy counts when it ran to the end (nbval's copies say so in metadata.m11_executed;
    `m11 course`'s copies run every cell or are not written) and holds the lesson's current code."""
    out = {}
    for src in sorted((root / "course").glob("[0-9][0-9]_*.ipynb")):
        ran, use = executed / src.name, (src, False)
        if ran.is_file():
            nb = nbformat.read(ran, as_version=4)
            fresh = _code(nb) == _code(nbformat.read(src, as_version=4))
            if fresh and nb.metadata.get("m11_executed", {}).get("complete", True):
                use = (ran, True)
        out[src.stem] = use
    return out


def _index(root: Path, lessons: dict[str, tuple[Path, bool]]) -> str:
    titles = {stem: deck_title(nbformat.read(path, as_version=4), stem) for stem, (path, _) in lessons.items()}
    rows = "\n".join(f"lessons/{stem}" for stem in lessons)
    exercises = "\n".join(f"exercises/{stem}" for stem in lessons if (root / "exercises" / f"{stem}.ipynb").is_file())
    listing = "\n".join(f"{i}. [{titles[s]}](lessons/{s}.ipynb)" for i, s in enumerate(lessons))
    return (f"# M11 · Training at Scale\n\nHow large models are trained, lesson by lesson: each page is the lesson "
            f"notebook as it ran, with its outputs and plots. Run any of them in Colab or SageMaker Studio Lab from "
            f"the links at the top of its page; the [slides](slides/index.html) present the same notebooks.\n\n"
            f"{listing}\n\n```{{toctree}}\n:maxdepth: 1\n:caption: Lessons\n\n{rows}\n```\n\n"
            f"```{{toctree}}\n:maxdepth: 1\n:caption: Exercises\n\n{exercises}\n```\n")


def build_site(root: Path, executed: Path, out: Path, decks: bool = True) -> dict[str, tuple[Path, bool]]:
    """Write the site into out/ (replaced); return the lessons' sources."""
    for name in ("sphinx", "myst_nb"):  # run as `python -m sphinx`: say what is missing before any work
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    if not installed(assets_dir()):
        raise FileNotFoundError(f"the site's math (MathJax) and decks need the offline assets: {assets_hint()}")
    lessons = sources(root, executed)
    with tempfile.TemporaryDirectory(prefix="m11-site-src-") as tmp:
        src = Path(tmp)
        for part in ("lessons", "exercises", "_static"):
            (src / part).mkdir()
        shutil.copy2(TEMPLATE / "conf.py", src / "conf.py")
        shutil.copy2(TEMPLATE / "m11-site.css", src / "_static" / "m11-site.css")
        shutil.copytree(assets_dir() / "mathjax", src / "_static" / "mathjax")
        for stem, (path, _) in lessons.items():
            nbformat.write(lesson_page(path, stem), src / "lessons" / f"{stem}.ipynb")
            exercise = root / "exercises" / f"{stem}.ipynb"
            if exercise.is_file():
                nbformat.write(exercise_page(exercise, stem), src / "exercises" / f"{stem}.ipynb")
        (src / "index.md").write_text(_index(root, lessons), encoding="utf-8")
        build = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", "1", str(src),
                                str(src / "_build")], capture_output=True, text=True)
        if build.returncode != 0:
            raise RuntimeError(f"sphinx-build failed ({build.returncode}):\n{build.stdout[-3000:]}{build.stderr[-3000:]}")
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(src / "_build", out, ignore=shutil.ignore_patterns(".doctrees", ".buildinfo"))
        if decks:
            for stem, (path, _) in lessons.items():
                public = src / "decks" / path.name
                public.parent.mkdir(exist_ok=True)
                nbformat.write(deck_view(path), public)
                build_deck(public, out / "slides")
            write_index(out / "slides")
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ and _images/ as they are
    return lessons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="m11 site", description=__doc__.splitlines()[0])
    parser.add_argument("--executed", type=Path, default=None,
                        help="folder of executed lesson notebooks (default: build/executed, from `m11 course`)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: build/site)")
    parser.add_argument("--no-decks", action="store_true", help="leave out the slides (faster)")
    args = parser.parse_args(argv)
    root = repo_root()
    executed = args.executed or root / "build" / "executed"
    out = args.out or root / "build" / "site"
    try:
        lessons = build_site(root, executed, out, decks=not args.no_decks)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"m11 site: {e}", file=sys.stderr)
        return 1
    stale = [s for s, (_, ran) in lessons.items() if not ran]
    if stale:
        print(f"m11 site: no complete, current executed copy in {executed} for {', '.join(stale)}: those pages show "
              "only their stored outputs (run `m11 course` first for every output and plot)", file=sys.stderr)
    print(out / "index.html")
    return 0
