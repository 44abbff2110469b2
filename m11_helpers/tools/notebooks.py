"""The stored form of notebooks: what `m11 nbclean` writes, and a percent-script authoring format.

    m11 nbclean course/ solutions/              rewrite every notebook in place, cleaned
    m11 nbclean --check course/ solutions/      write nothing; exit 1 listing notebooks not clean
    m11 nbclean --refresh course/05_zero.ipynb  execute first (cwd = its folder), then clean
    m11 nbclean --from-percent src.py -o course/05_zero.ipynb

**Clean** means: no execution counts, notebook metadata reduced to the kernelspec (python3) and
`language_info: {name: python}`, cell metadata reduced to `slideshow`, `tags`, `m11`, and no
outputs except in code cells whose first line is `# NBVAL_CHECK_OUTPUT`. Those keep their outputs
(metadata stripped, `execution_count` of results set to None) and the cell keeps
`execution_count: 1`, because nbval only compares outputs of cells that look executed (it rejects
an unrun cell with outputs). Written by `nbformat.write` (sorted keys, indent 1), nbformat 4.5.

**Percent format** (`from_percent`), the jupytext "percent" style::

    # %% [markdown] slide=slide
    # # Lesson title
    # Markdown lines start with "# ", which is removed.

    # %% slide=fragment m11={"exercise": "0.1", "role": "solution"}
    def average(xs):
        ### BEGIN SOLUTION
        return sum(xs) / len(xs)
        ### END SOLUTION

    # %% m11={"exercise": "0.1", "role": "check", "points": 2} tags=["graded"]
    # %% [raw]

A cell starts at a line beginning with `# %%`; `[markdown]` (or `[md]`, `[raw]`, `[code]`) gives
its type (default code). Then `key=VALUE` pairs, where VALUE is JSON or a bare word: `slide=X`
(shorthand for `slideshow={"slide_type": "X"}`, default "-"), `slideshow=`, `tags=`, `m11=`,
`id=`. Leading and trailing blank lines of a cell are dropped; text before the first marker
becomes a code cell. Cell ids default to `cell-N` so the same script gives the same notebook.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Iterable

import nbformat
from nbformat import NotebookNode
from nbformat.reader import NotJSONError

from m11_helpers.grading.cells import CHECK_OUTPUT, META

__all__ = ["CHECK_MARKER", "clean", "dumps", "is_clean", "find_notebooks", "from_percent",
           "is_checked", "refresh", "main"]

CHECK_MARKER = CHECK_OUTPUT  # the cell vocabulary is grading/cells.py's
KEPT_CELL_METADATA = ("slideshow", "tags", META)
SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def is_checked(cell: NotebookNode) -> bool:
    """True for a code cell whose first line is `# NBVAL_CHECK_OUTPUT` (its outputs are kept)."""
    if cell.get("cell_type") != "code":
        return False
    lines = cell.get("source", "").lstrip("\n").splitlines()
    return bool(lines) and lines[0].strip() == CHECK_MARKER


def _clean_output(out: NotebookNode) -> NotebookNode:
    if "metadata" in out:
        out["metadata"] = {}  # widths, "isolated", library versions: volatile, never reviewed
    if out.get("output_type") == "execute_result":
        out["execution_count"] = None
    out.pop("transient", None)
    return out


def clean(nb: NotebookNode) -> NotebookNode:
    """Return a cleaned copy of `nb` (see the module docstring); cleaning twice changes nothing."""
    nb = copy.deepcopy(nb)
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = nbformat.from_dict({"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}})
    seen: set[str] = set()
    for i, cell in enumerate(nb.cells):
        # Old notebooks have no ids; deterministic ones keep `--check` stable between runs.
        cid = cell.get("id") or f"cell-{i}"
        while cid in seen:
            cid = f"{cid}-{i}"
        seen.add(cid)
        cell["id"] = cid
        cell.metadata = nbformat.from_dict({k: cell.metadata[k] for k in KEPT_CELL_METADATA
                                            if k in cell.get("metadata", {})})
        if cell.cell_type != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
            continue
        if is_checked(cell):
            cell.outputs = [_clean_output(o) for o in cell.get("outputs", [])]
            cell.execution_count = 1 if cell.outputs else None
        else:
            cell.outputs, cell.execution_count = [], None
    return nb


def dumps(nb: NotebookNode) -> str:
    """The exact text `nbformat.write` puts in a file (sorted keys, indent 1, final newline)."""
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def is_clean(path: str | Path) -> bool:
    """True when the file at `path` is byte-for-byte what `m11 nbclean` would write."""
    text = Path(path).read_text(encoding="utf-8")
    return text == dumps(clean(nbformat.reads(text, as_version=4)))


def find_notebooks(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders (recursively) into `*.ipynb` paths, skipping checkpoints."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.suffix == ".ipynb" and p.is_file():
            found.append(p)
        else:
            raise ValueError(f"path={str(p)!r}: expected an existing .ipynb file or folder")
    return found


def refresh(nb: NotebookNode, cwd: str | Path, timeout: float = 600) -> NotebookNode:
    """Execute `nb` top to bottom in a fresh python3 kernel with cwd `cwd`; return it executed."""
    from m11_helpers.tools.kernels import notebook_client  # imported here: `--check` should not pay for it

    nb = copy.deepcopy(nb)
    notebook_client(nb, cwd=cwd, timeout=timeout).execute()
    return nb


# ---------------------------------------------------------------- percent format

_MARKER = re.compile(r"^#\s?%%(?!%)(.*)$")
_KIND = re.compile(r"^\s*\[(markdown|md|raw|code)\]")
_KEY = re.compile(r"\s*([A-Za-z_][\w-]*)=")


def _parse_options(text: str, lineno: int) -> tuple[str, dict]:
    """Parse `[kind] key=VALUE ...` from a marker line; return (cell type, cell metadata)."""
    kind = "code"
    m = _KIND.match(text)
    if m:
        kind = {"md": "markdown"}.get(m.group(1), m.group(1))
        text = text[m.end():]
    meta: dict = {}
    decoder, pos, text = json.JSONDecoder(), 0, text.rstrip()
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = _KEY.match(text, pos)
        if not m:
            raise ValueError(f"line {lineno}: expected key=VALUE after '# %%', got {text[pos:].strip()!r}")
        key, pos = m.group(1), m.end()
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            word = re.match(r"[^\s]*", text[pos:]).group(0)
            if word[:1] in "{[\"":  # looked like JSON: say so instead of storing a broken string
                raise ValueError(f"line {lineno}: {key}= is not valid JSON: {word!r}") from None
            value, pos = word, pos + len(word)
        if key == "slide":
            if value not in SLIDE_TYPES:
                raise ValueError(f"line {lineno}: slide={value!r}; allowed: {', '.join(SLIDE_TYPES)}")
            meta["slideshow"] = {"slide_type": value}
        elif key in ("slideshow", META) and isinstance(value, dict):
            meta[key] = value
        elif key == "tags" and isinstance(value, list):
            meta[key] = value
        elif key == "id" and isinstance(value, str):
            meta["__id__"] = value
        else:
            raise ValueError(f"line {lineno}: bad {key}={value!r}; allowed keys: slide=WORD, "
                             "slideshow={...}, m11={...}, tags=[...], id=WORD")
    meta.setdefault("slideshow", {"slide_type": "-"})
    return kind, meta


def _uncomment(line: str) -> str:
    if line.startswith("# "):
        return line[2:]
    return "" if line.rstrip() == "#" else line


def from_percent(text: str) -> NotebookNode:
    """Build a (clean) notebook from a percent-format script (format in the module docstring)."""
    chunks: list[tuple[str, dict, list[str]]] = []
    lines: list[str] = []
    kind, meta = "code", {"slideshow": {"slide_type": "-"}}
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _MARKER.match(line)
        if m:
            if chunks or any(s.strip() for s in lines):
                chunks.append((kind, meta, lines))
            kind, meta = _parse_options(m.group(1), lineno)
            lines = []
        else:
            lines.append(_uncomment(line) if kind == "markdown" else line)
    if chunks or any(s.strip() for s in lines):
        chunks.append((kind, meta, lines))

    nb = nbformat.v4.new_notebook()
    for i, (kind, meta, body) in enumerate(chunks):
        while body and not body[0].strip():
            body = body[1:]
        while body and not body[-1].strip():
            body = body[:-1]
        new = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
               "raw": nbformat.v4.new_raw_cell}[kind]
        cell = new("\n".join(body))
        cell["id"] = meta.pop("__id__", f"cell-{i}")
        cell.metadata = nbformat.from_dict(meta)
        nb.cells.append(cell)
    return clean(nb)


# ---------------------------------------------------------------- command line

def main(argv: list[str]) -> int:
    """`m11 nbclean`: clean notebooks in place, check them, refresh them or build one from a script."""
    ap = argparse.ArgumentParser(prog="m11 nbclean", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="notebooks or folders (searched recursively)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if any is not clean")
    ap.add_argument("--refresh", action="store_true", help="execute each notebook first, then clean")
    ap.add_argument("--timeout", type=float, default=600, help="per-cell timeout for --refresh (s)")
    ap.add_argument("--from-percent", metavar="SRC", help="build a notebook from a percent script")
    ap.add_argument("-o", "--output", metavar="OUT", help="where --from-percent writes")
    args = ap.parse_args(argv)

    if args.from_percent:
        if not args.output or args.paths:
            ap.error("--from-percent SRC needs -o OUT.ipynb and no other paths")
        try:
            nb = from_percent(Path(args.from_percent).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"m11 nbclean: {args.from_percent}: {e}", file=sys.stderr)
            return 2
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(dumps(nb), encoding="utf-8")
        print(f"wrote {args.output}")
        return 0
    if not args.paths:
        ap.error("give at least one notebook or folder (or --from-percent SRC -o OUT)")
    if args.check and args.refresh:
        ap.error("--check and --refresh exclude each other")
    try:
        paths = find_notebooks(args.paths)
    except ValueError as e:
        print(f"m11 nbclean: {e}", file=sys.stderr)
        return 2

    dirty, invalid = [], []
    for path in paths:
        try:
            if args.check:
                if not is_clean(path):
                    dirty.append(path)
                continue
            nb = nbformat.read(path, as_version=4)
            if args.refresh:
                nb = refresh(nb, path.parent, timeout=args.timeout)
            text = dumps(clean(nb))
        except (NotJSONError, nbformat.ValidationError) as e:  # not JSON, or not what nbformat calls a notebook
            invalid.append(f"{path}: {str(e).strip().splitlines()[0][:200]}")
            continue
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"cleaned {path}")
    if invalid:
        print("m11 nbclean: not valid notebooks (left as they are):", *invalid, sep="\n  ", file=sys.stderr)
        return 2
    if dirty:
        print("not clean (run `m11 nbclean PATH` to fix):", *dirty, sep="\n  ")
        return 1
    return 0
