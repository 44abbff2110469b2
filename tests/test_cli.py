"""The `m11` command: every subcommand parses its arguments, usage errors exit 2, no traceback for a mistake."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from m11_helpers import __version__
from m11_helpers.tools import pytest_fast_start
from m11_helpers.tools.cli import COMMANDS, main
from m11_helpers.tools.fast_start import skip_iri_grammar
from m11_helpers.tools.setup_cell import install_spec, setup_cell_source


def m11(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "m11_helpers.tools.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_version_and_help(capsys):
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"m11 {__version__}"
    assert main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert all(name in usage for name in COMMANDS)
    assert main([]) == 2


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_refuses_an_unknown_flag_with_exit_2(command):
    out = m11(command, "--bogus-flag")
    assert out.returncode == 2, (command, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("command", ["course", "slides", "make-exercises", "new-lesson 98 demo"])
def test_commands_that_need_the_repository_say_so_outside_it_with_exit_2(command, tmp_path):
    out = m11(*command.split(), cwd=tmp_path)
    assert out.returncode == 2, (command, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "run inside the course repository" in out.stderr, out.stderr


def test_slides_outside_the_repository_with_a_notebook_builds_a_cdn_deck(tmp_path, monkeypatch):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Alone")])
    nbformat.write(nb, tmp_path / "alone.ipynb")
    monkeypatch.chdir(tmp_path)  # in-process: the subprocess tests above already cover the exit codes' path
    assert main(["slides", "alone.ipynb", "--cdn"]) == 0
    assert (tmp_path / "slides" / "alone.slides.html").is_file() and (tmp_path / "slides" / "index.html").is_file()
    assert main(["slides", "missing.ipynb", "--cdn"]) == 2


def test_unknown_command_exits_2():
    out = m11("frobnicate")
    assert out.returncode == 2 and "unknown command" in out.stderr


def test_script_prints_a_packaged_path():
    out = m11("script", "train.py")
    assert out.returncode == 0 and out.stdout.strip().endswith("scripts/train.py")
    assert m11("script", "missing.py").returncode == 2


def test_setup_cell_installs_this_release():
    assert install_spec().endswith(f"@v{__version__}")
    assert "from m11_helpers import setup" in setup_cell_source()


def test_tool_modules(tmp_path):
    import nbformat

    from m11_helpers.tools.course import deprecations
    from m11_helpers.tools.doctor import checks
    from m11_helpers.tools.paths import repo_root
    from m11_helpers.tools.scripts import main as script_main

    assert (repo_root(tmp_path.parent) if (tmp_path.parent / "pyproject.toml").exists() else None) is None
    with pytest.raises(ValueError, match="no pyproject.toml"):
        repo_root(tmp_path)
    assert {what for what, _, _ in checks()} >= {"torch", "accelerate", "matplotlib"}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="FutureWarning: old API\n")]
    assert deprecations(nb) == ["cell 0: FutureWarning: old API"]
    assert script_main([]) == 0


def test_a_command_does_not_build_the_iri_grammar_and_nbformat_still_validates(tmp_path):
    """`m11` skips jsonschema's IRI grammar (fast_start.py: 1 s of every start); nbformat still rejects a bad cell."""
    import nbformat

    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), good)
    bad.write_text('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "nope"}]}')
    probe = """
import sys
from m11_helpers.tools.cli import main
main(["nbclean", "--check", sys.argv[1]])  # a command that reads notebooks
import nbformat
try:
    nbformat.validate(nbformat.read(sys.argv[2], as_version=4))
    print("valid")
except nbformat.ValidationError:
    print("invalid")
print("rfc3987_syntax.syntax_helpers" in sys.modules, sys.modules.get("rfc3987_syntax", 0))
"""
    ran = subprocess.run([sys.executable, "-c", probe, str(good), str(bad)], capture_output=True, text=True,
                         timeout=120)
    assert ran.stdout.split()[-3:] == ["invalid", "False", "None"], (ran.stdout, ran.stderr)
    # this process too: the suite's `-p` plugin skipped it before nbval's entry point imported nbformat
    assert pytest_fast_start.skip_iri_grammar is skip_iri_grammar and sys.modules.get("rfc3987_syntax", 0) is None
    imported = sys.modules["rfc3987_syntax"] = types.ModuleType("rfc3987_syntax")
    try:
        skip_iri_grammar()
        assert sys.modules["rfc3987_syntax"] is imported  # what was imported stays imported
    finally:
        sys.modules["rfc3987_syntax"] = None


def test_nbclean_names_a_file_that_is_not_a_notebook_and_leaves_it(tmp_path, capsys):
    bad, broken = tmp_path / "bad.ipynb", tmp_path / "broken.ipynb"
    bad.write_text('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "nope"}]}')
    broken.write_text('{"cells": [')
    for args in (["--check"], []):
        assert main(["nbclean", *args, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "not valid notebooks" in err and f"{bad}:" in err and f"{broken}:" in err and "Traceback" not in err
    assert broken.read_text() == '{"cells": ['  # left as it was


def test_where_lists_lesson_04s_places_as_they_are_on_disk(capsys, monkeypatch):
    """`m11 where 04` against the files, computed here without its code: glob, notebook JSON, line scan."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    assert main(["where", "04"]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = [ln.split()[0].rstrip(":") if ln.startswith("  ") and not ln.startswith("    ") else ln for ln in out]
    for path in ("m11_helpers/pipeline.py", "m11_helpers/tensor_parallel_run.py", "course/04_model_parallel.ipynb",
                 "exercises/04_model_parallel.ipynb", "tests/test_tensor_parallel.py"):
        assert path in listed and (root / path).is_file(), path
    assert "quiz: m11_helpers/quizzes/q04_model_parallel.py" in out and "deck: build/slides/04_model_parallel" in out[-1]
    assert len([p for p in root.glob("m11_helpers/quizzes/q04_*.py")]) == 1
    for folder in ("solutions", "exercises"):  # every exercise cell, numbered from 1 as the JSON lists them
        cells = json.loads((root / folder / "04_model_parallel.ipynb").read_text())["cells"]
        want: dict[str, list[str]] = {}
        for i, c in enumerate(cells, 1):
            if "exercise" in c["metadata"].get("m11", {}):
                want.setdefault(c["metadata"]["m11"]["exercise"], []).append(f"{c['metadata']['m11']['role']} cell {i}")
        block = out[out.index(f"  {folder}/04_model_parallel.ipynb") + 1:][:len(want)]
        assert block == [f"    {ex}: {', '.join(v)}" for ex, v in want.items()] and len(want) >= 3
    lines = (root / "solutions/wrong_answers/04_model_parallel.py").read_text().splitlines()
    heads = [(n, ln.split()[2]) for n, ln in enumerate(lines, 1) if ln.startswith("# %% ") and "| expect:" in ln]
    exercises = list(dict.fromkeys(ex for _, ex in heads))
    for k, ex in enumerate(exercises):
        first = min(n for n, e in heads if e == ex)
        last = min(n for n, e in heads if e == exercises[k + 1]) - 1 if k + 1 < len(exercises) else len(lines)
        count = sum(e == ex for _, e in heads)
        assert f"    {ex}: lines {first}-{last} ({count} answers)" in out
    assert main(["where", "99"]) == 2 and "no such lesson" in capsys.readouterr().err


def test_where_table_regenerates_a_stale_contributing_table(tmp_path):
    from pathlib import Path

    from m11_helpers.lessons import markdown_table
    from m11_helpers.tools.where import write_table

    text = (Path(__file__).resolve().parents[1] / "CONTRIBUTING.md").read_text()
    (tmp_path / "CONTRIBUTING.md").write_text(text.replace("| 00_welcome |", "| 00_stale |"))
    write_table(tmp_path)
    fresh = (tmp_path / "CONTRIBUTING.md").read_text()
    assert fresh == text.split("<!-- lesson-table:start -->")[0] + "<!-- lesson-table:start -->\n" + markdown_table() \
        + "\n<!-- lesson-table:end -->" + text.split("<!-- lesson-table:end -->")[1] and "00_stale" not in fresh
