"""CONTRIBUTING's import rules ("The layout"), as one function a test runs on the repository or on a planted tree.

    problems(ROOT)        # [] when every rule holds; else one line per import that breaks one

The rules, by importer (names relative to `m11_helpers`; "lesson NN" from the lesson table, m11_helpers/lessons.py):

- a kit module: the kit only (no lesson module, nothing of `tools` or `grading`);
- a lesson module of lesson NN: the kit, lessons ≤ NN, and of `grading` only the check-cell API;
- a quiz `quizzes/qNN_*.py`: the kit and lessons ≤ NN, nothing of `tools` or `grading`;
- `tools` and `grading`: anything of the package;
- a notebook of lesson NN (course/, solutions/, exercises/) and its wrong answers: the kit, lessons ≤ NN and
  the check-cell API; of `tools` only what TOOLS_IN_NOTEBOOKS lists for it.

The check-cell API is `grading.checks`, `grading.plain`, `grading.observe`, `grading.faults` (CHECK_CELL_API):
anything else under `grading` is the grader's own, wherever it is housed.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from m11_helpers import lessons

CHECK_CELL_API = ("grading.checks", "grading.plain", "grading.observe", "grading.faults")
# the one notebook that imports a tool: lesson 00 prints `m11 doctor`'s checks for the learner's machine
TOOLS_IN_NOTEBOOKS = {"00_welcome": ("tools.doctor",)}


def _targets(tree: ast.AST) -> set[str]:
    """What `tree` imports of m11_helpers, relative: `from m11_helpers.x import y` gives 'x.y' (y may be a name)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {n.removeprefix("m11_helpers.") for n in found if n.startswith("m11_helpers.")}


def _code(notebook: Path) -> str:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    lines = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return "\n".join(ln for ln in "\n".join(lines).splitlines() if not ln.lstrip().startswith(("%", "!")))


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _judge(who: str, imports: set[str], lesson: str | None, kind: str, rows) -> list[str]:
    """The imports of one file that its kind may not make; lesson: its number ('04'), None for the kit."""
    of_lesson = {m: r.number for r in rows if isinstance(r, lessons.Lesson) for m in r.modules}
    bad = []
    for imp in sorted(imports):
        top = imp.split(".")[0]
        if top in ("tools", "grading"):
            allowed = kind in ("lesson", "notebook") and _within(imp, CHECK_CELL_API) \
                or kind == "notebook" and _within(imp, TOOLS_IN_NOTEBOOKS.get(who.split("/")[-1].split(".")[0], ()))
            if not allowed:
                bad.append(f"{who} ({kind}) imports {imp}: only tools and grading import that")
        elif top in of_lesson and (lesson is None or of_lesson[top] > lesson):
            later = "a lesson's" if lesson is None else f"a later lesson's ({of_lesson[top]})"
            bad.append(f"{who} ({kind}{'' if lesson is None else ' of lesson ' + lesson}) imports {later} module {imp}")
    return bad


def problems(root: Path, rows=lessons.ROWS) -> list[str]:
    """Every import under `root` (its m11_helpers/, course/, solutions/, exercises/) that breaks a rule above."""
    pkg = root / "m11_helpers"
    layer = {m: r for r in rows for m in r.modules}
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        if rel.parts[0] == "scripts" or "templates" in rel.parts or rel == Path("__init__.py"):
            continue
        imports = _targets(ast.parse(path.read_text(encoding="utf-8")))
        row = layer.get(rel.with_suffix("").parts[0])
        if rel.parts[0] == "quizzes" and rel.name != "__init__.py":
            bad += _judge(f"m11_helpers/{rel.as_posix()}", imports, rel.stem[1:3], "quiz", rows)
        elif row is not None and row.name == "kit":
            bad += _judge(f"m11_helpers/{rel.as_posix()}", imports, None, "kit", rows)
        elif isinstance(row, lessons.Lesson):
            bad += _judge(f"m11_helpers/{rel.as_posix()}", imports, row.number, "lesson", rows)
    for folder in ("course", "solutions", "exercises"):
        for nb in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            bad += _judge(f"{folder}/{nb.name}", _targets(ast.parse(_code(nb))), nb.name[:2], "notebook", rows)
    for wa in sorted((root / "solutions" / "wrong_answers").glob("[0-9][0-9]_*.py")):
        bad += _judge(f"solutions/wrong_answers/{wa.name}", _targets(ast.parse(wa.read_text(encoding="utf-8"))),
                      wa.name[:2], "notebook", rows)
    return bad
