"""The architecture, enforced: every module in the lesson table, tested, in its layer, small, no import circle."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from m11_helpers import lessons
from support import import_rules

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "m11_helpers"
MAX_LINES = 300
# split: this file is checked too; the last is the folder the course was written in (a learner's differs)
OUTSIDE = ("../" + "shared", "CPU-DISTRIBUTED" + "-FACTS", "LESSON-" + "CHECKLIST", "/work" + "/main")
# a clone has no issue tracker: a comment says what was asked, in words, never an issue number
TRACKER = re.compile(r"\b[Ii]ssues? ?#?\d+")


def lesson_table() -> dict[str, tuple[list[str], list[str]]]:
    """The lesson table (m11_helpers/lessons.py): row -> (modules, test files)."""
    return {r.name: (list(r.modules), list(r.tests)) for r in lessons.ROWS}


def test_contributing_shows_the_lesson_table_of_lessons_py():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    body = text.split("<!-- lesson-table:start -->")[1].split("<!-- lesson-table:end -->")[0]
    assert body.strip() == lessons.markdown_table(), "CONTRIBUTING.md's lesson table is generated: run `m11 where --table`"


def modules() -> dict[str, Path]:
    """Every importable module of the package, by dotted name relative to m11_helpers (scripts excluded)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        if rel.parts[0] in ("scripts",) or "templates" in rel.parts or rel.name == "__init__" and len(rel.parts) == 1:
            continue
        if rel.parts[0] == "quizzes" and rel.name != "__init__":
            continue  # question data, loaded by name; tests/test_quizzes.py checks every lesson's
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def owner(module: str, rows: dict) -> list[str]:
    top = module.split(".")[0]
    return [name for name, (mods, _) in rows.items() if top in mods]


def imports_of(path: Path) -> set[str]:
    """m11_helpers modules `path` imports (relative names), at any depth in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found |= {n.removeprefix("m11_helpers.") for n in names if n.startswith("m11_helpers.")}
    return found


def test_every_module_is_in_exactly_one_row_of_the_lesson_table():
    rows = lesson_table()
    problems = [f"{m}: in rows {owner(m, rows)}" for m in modules() if len(owner(m, rows)) != 1]
    listed = {m for mods, _ in rows.values() for m in mods}
    ghosts = [m for m in listed if not (PKG / f"{m}.py").exists() and not (PKG / m).is_dir()]
    assert not problems, "add each module to one row of CONTRIBUTING.md's lesson table: " + "; ".join(problems)
    assert not ghosts, f"the lesson table names modules that do not exist: {ghosts}"


def test_every_lesson_has_a_row_and_every_row_its_test_files():
    rows = lesson_table()
    lessons = sorted(p.stem for p in (ROOT / "course").glob("[0-9][0-9]_*.ipynb"))
    assert [r for r in rows if r[:2].isdigit()] == lessons
    for name, (_, tests) in rows.items():
        for t in tests:
            assert (ROOT / "tests" / t).is_file(), f"{name}: tests/{t} does not exist"


def test_every_lesson_has_its_whole_room_and_each_module_names_its_lesson():
    missing, unnamed = [], []
    for row in lessons.LESSONS:
        missing += [p for role, p in row.places().items() if role != "deck" and not (ROOT / p).is_file()]
        for m in row.modules:
            doc = ast.get_docstring(ast.parse((PKG / f"{m}.py").read_text(encoding="utf-8"))) or ""
            if not re.search(rf"\b[Ll]esson {row.number}\b", doc):
                unnamed.append(f"{m} (lesson {row.number})")
    assert not missing, f"lessons.py names files that do not exist (m11 new-lesson writes them all): {missing}"
    assert not unnamed, f"say 'lesson NN' in these modules' docstrings: {unnamed}"


def test_every_module_is_imported_by_a_test():
    rows = lesson_table()
    tested = set()
    for _, (_, tests) in rows.items():
        for t in tests:
            tested |= imports_of(ROOT / "tests" / t)
    for t in (ROOT / "tests").rglob("test_*.py"):
        tested |= imports_of(t)
    mods = modules()
    for _ in range(3):  # importing a package imports what its __init__ imports
        tested |= {i for m in list(tested) if m in mods and mods[m].name == "__init__.py" for i in imports_of(mods[m])}
    untested = [m for m in mods if not any(x == m or x.startswith(m + ".") for x in tested)]
    assert not untested, f"no test imports these modules: {untested}"


def test_import_rules_hold():
    """CONTRIBUTING's import rules (tests/support/import_rules.py says each): kit, lessons, quizzes, notebooks."""
    bad = import_rules.problems(ROOT)
    assert not bad, "\n".join(bad)


def test_import_rules_catch_each_planted_violation(tmp_path):
    """Each rule fails on a small tree that breaks it, and lets through the imports the rules allow."""
    files = {  # path -> (what it imports, broken?)
        "m11_helpers/timing.py": ("from m11_helpers.zero import min_gpus", True),  # kit -> lesson
        "m11_helpers/validate.py": ("from m11_helpers.tools.paths import repo_root", True),  # kit -> tools
        "m11_helpers/display.py": ("from m11_helpers.grading import observe", True),  # kit -> grading
        "m11_helpers/welcome.py": ("from m11_helpers.hsdp import hsdp_mesh", True),  # lesson 00 -> lesson 12
        "m11_helpers/hardware.py": ("from m11_helpers.grading.runner import run", True),  # not the check-cell API
        "m11_helpers/roofline.py": ("import m11_helpers.tools.doctor", True),  # lesson -> tools
        "m11_helpers/collectives.py": ("from m11_helpers.grading.observe import record_comm\n"
                                       "from m11_helpers.hardware import ping_pong", False),
        "m11_helpers/quizzes/q01_hardware.py": ("from m11_helpers.zero import min_gpus", True),  # quiz -> later
        "m11_helpers/quizzes/q03_data_parallel.py": ("from m11_helpers.grading.checks import passed", True),
        "m11_helpers/quizzes/q05_zero_fsdp.py": ("from m11_helpers.zero import min_gpus\n"
                                                 "from m11_helpers.config import RUNNING_EXAMPLE", False),
        "m11_helpers/tools/anything.py": ("from m11_helpers.grading.runner import run\n"
                                          "from m11_helpers.hsdp import hsdp_mesh", False),
        "course/00_welcome.ipynb": ("from m11_helpers.tools.doctor import checks", False),  # the listed exception
        "course/01_hardware.ipynb": ("from m11_helpers.tools.doctor import checks", True),
        "course/02_collectives.ipynb": ("from m11_helpers.overlap import layer_flops", True),  # lesson 04's
        "solutions/02_collectives.ipynb": ("%matplotlib inline\nfrom m11_helpers.grading.faults import x\n"
                                           "from m11_helpers.grading.checks import passed", False),
        "solutions/03_data_parallel.ipynb": ("from m11_helpers.grading.grader import grade", True),
        "exercises/03_data_parallel.ipynb": ("import m11_helpers.grading.sandbox", True),
        "solutions/wrong_answers/02_collectives.py": ("from m11_helpers.grading.guard import VERIFIED", True),
    }
    for rel, (code, _) in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".ipynb"):
            code = json.dumps({"cells": [{"cell_type": "code", "source": code.splitlines(True), "metadata": {}}]})
        path.write_text(code)
    flagged = {line.split(" ")[0] for line in import_rules.problems(tmp_path)}
    assert flagged == {rel for rel, (_, broken) in files.items() if broken}


def test_no_import_circle():
    mods = modules()
    graph = {m: {i for i in imports_of(p) if i in mods or i.rsplit(".", 1)[0] in mods} for m, p in mods.items()}
    graph = {m: {i if i in mods else i.rsplit(".", 1)[0] for i in deps} - {m} for m, deps in graph.items()}
    # a package's __init__ re-exporting its own submodules is not a circle
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path + [m, d]
            if d not in state and (cycle := visit(d, path + [m])):
                return cycle
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m, [])
            assert cycle is None, "import circle: " + " -> ".join(cycle[cycle.index(cycle[-1]):])


def sources() -> dict[str, Path]:
    """The package's modules and the training scripts it ships (run by `accelerate launch`, read like modules)."""
    return {**modules(), **{f"scripts.{p.stem}": p for p in sorted((PKG / "scripts").glob("*.py"))}}


@pytest.mark.parametrize("mod", sorted(sources()))
def test_module_is_short(mod):
    n = len(sources()[mod].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{mod} has {n} lines (> {MAX_LINES}): split it into modules with one idea each"


def test_nothing_refers_outside_the_repository():
    bad = []
    for path in ROOT.rglob("*"):
        if any(part in (".git", ".venv", "build", "node_modules", "__pycache__", ".ruff_cache", ".pytest_cache",
                        ".ipynb_checkpoints", "reports") for part in path.parts) \
                or not path.is_file() or path.suffix not in (".py", ".md", ".ipynb", ".toml", ".yml", ".yaml", ""):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if any(marker in text for marker in OUTSIDE) or TRACKER.search(text):
            bad.append(str(path.relative_to(ROOT)))
    assert not bad, f"these files refer to files or an issue tracker outside the repository: {bad}"


# Files whose `isinstance(x, bool)` is not an argument check, and why (anything else goes through validate).
BOOL_TESTS_OK = {
    "display.py": "formats table cells: a bool is shown as True/False and is not a numeric column",
    "grading/authoring/exercises.py": "reports bad notebook metadata (points) in a list of problems; it raises nothing",
}
HAND_CHECK = re.compile(r"^(_positive\w*|_check_pos\w*|_check_n)$")


def test_argument_checks_go_through_validate():
    """One way to do each thing: argument checks are m11_helpers.validate's, not hand-written ones."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel == "validate.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and HAND_CHECK.match(node.name):
                bad.append(f"{rel}:{node.lineno}: defines {node.name}()")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                  and len(node.args) == 2 and rel not in BOOL_TESTS_OK):
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                if any(isinstance(k, ast.Name) and k.id == "bool" for k in kinds):
                    bad.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, ("check arguments with m11_helpers.validate (positive_int, positive_real, fraction, one_of, …) "
                     "instead of by hand:\n" + "\n".join(bad))


def test_grading_rooms_say_who_they_serve_share_no_private_names_and_import_in_one_direction():
    """grading/ in rooms (CONTRIBUTING, "The grading route"): each room's `__init__` is its docstring alone;
    no file imports, or reads through a module, another file's private name; the rooms import one way (the
    top level, the check-cell API and its vocabularies, imports no room) and none imports a room that
    imports it back (a circle between modules: test_no_import_circle); the grading route CONTRIBUTING draws
    names modules that exist."""
    grading = PKG / "grading"
    rooms = sorted(p.parent.name for p in grading.glob("*/__init__.py"))
    assert rooms and "templates" not in rooms
    bad = []
    for room in rooms:
        tree = ast.parse((grading / room / "__init__.py").read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        if not doc or len(tree.body) != 1:
            bad.append(f"grading/{room}/__init__.py: a docstring saying who uses the room and what it may import, "
                       "and nothing else")
    mods = {m: p for m, p in modules().items() if m.startswith("grading.")}

    def room_of(mod: str) -> str:
        parts = mod.split(".")
        return parts[1] if len(parts) > 2 or parts[1] in rooms else "top"

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = {}  # local name -> grading module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("m11_helpers.grading"):
                source = node.module.removeprefix("m11_helpers.")
                for a in node.names:
                    sub = f"{source}.{a.name}"
                    target = sub if sub in mods else source
                    if target in mods and target != mod:
                        graph[mod].add(target)
                    if sub in mods:
                        bound[a.asname or a.name] = sub
                    elif a.name.startswith("_"):
                        bad.append(f"{mod} imports the private name {a.name} from {source}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.removeprefix("m11_helpers.") in mods:
                        graph[mod].add(a.name.removeprefix("m11_helpers."))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{mod} reads the private name {bound[node.value.id]}.{node.attr}")
    reach = {r: {room_of(d) for m in graph if room_of(m) == r for d in graph[m]} - {r} for r in [*rooms, "top"]}
    bad += [f"the top level (check-cell API) imports the room {r}" for r in sorted(reach["top"])]
    bad += [f"rooms {a} and {b} import each other" for a in rooms for b in sorted(reach[a]) if b != "top"
            and a < b and a in reach.get(b, set())]
    route = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8").split("## The grading route")[1].split("```")[1]
    named = set(re.findall(r"\b([a-z_]+/)?([a-z_]+\.py)\b", route))
    assert len(named) > 10, "CONTRIBUTING's grading route names the module at each step"
    bad += [f"CONTRIBUTING's grading route names {d}{f}, which is not in grading/" for d, f in sorted(named)
            if not (grading / d / f).is_file()]
    assert not bad, "\n".join(bad)


def test_no_module_uses_another_files_private_names():
    """A leading underscore means "this file only" (CONTRIBUTING, "Style"): no file of the package, its
    scripts or its quizzes imports another module's private name or reads one through a module it imported.
    Renaming it public says a second file depends on it."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = set()  # local names that stand for an m11_helpers module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("m11_helpers"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}")
                    bound.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                bound.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("m11_helpers"))
        bad += [f"{path.relative_to(ROOT)}:{node.lineno} reads {node.value.id}.{node.attr}" for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert not bad, "private names used outside their file (make them public, or keep the use inside):\n" + "\n".join(bad)
