"""The stored form of notebooks: `clean`, the percent authoring format, and the committed notebooks."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from m11_helpers.tools import notebooks
from m11_helpers.tools.notebooks import clean, dumps, from_percent, is_clean

ROOT = Path(__file__).resolve().parents[1]


def _dirty() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "venv", "display_name": "My venv"},
                                            "widgets": {"state": {}}, "language_info": {"name": "python", "version": "3.11"}})
    plain = nbformat.v4.new_code_cell("print(1)", execution_count=7,
                                      metadata={"scrolled": True, "tags": ["x"], "m11": {"exercise": "1.1"}})
    plain.outputs = [nbformat.v4.new_output("stream", text="1\n")]
    checked = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\n2 + 2", execution_count=8,
                                        metadata={"collapsed": False, "slideshow": {"slide_type": "-"}})
    checked.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "4"},
                                              execution_count=8, metadata={"isolated": True})]
    nb.cells = [nbformat.v4.new_markdown_cell("# T", metadata={"jp-MarkdownHeadingCollapsed": True}),
                plain, checked]
    return nb


def test_clean_strips_volatile_parts_and_keeps_checked_outputs() -> None:
    nb = clean(_dirty())
    assert nb.metadata == {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                           "language_info": {"name": "python"}}
    md, plain, checked = nb.cells
    assert md.metadata == {}
    assert plain.metadata == {"tags": ["x"], "m11": {"exercise": "1.1"}}
    assert plain.outputs == [] and plain.execution_count is None
    assert checked.outputs[0]["data"] == {"text/plain": "4"}
    assert checked.outputs[0]["execution_count"] is None and checked.outputs[0]["metadata"] == {}
    assert checked.execution_count == 1  # nbval rejects an "unrun" cell that has outputs
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert dumps(clean(nb)) == dumps(nb)  # idempotent


def test_clean_keeps_ids_and_does_not_mutate_input() -> None:
    dirty = _dirty()
    ids = [c.id for c in dirty.cells]
    assert [c.id for c in clean(dirty).cells] == ids
    assert dirty.cells[1].execution_count == 7


def test_is_clean_and_cli_check_then_fix(tmp_path: Path, capsys) -> None:
    path = tmp_path / "sub" / "a.ipynb"
    path.parent.mkdir()
    nbformat.write(_dirty(), path)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    nbformat.write(_dirty(), tmp_path / ".ipynb_checkpoints" / "a-checkpoint.ipynb")
    assert not is_clean(path)
    assert notebooks.main(["--check", str(tmp_path)]) == 1
    assert "a.ipynb" in capsys.readouterr().out
    assert notebooks.main([str(tmp_path)]) == 0
    assert is_clean(path) and notebooks.main(["--check", str(tmp_path)]) == 0
    assert notebooks.main(["--check", str(tmp_path / "nope.ipynb")]) == 2


PERCENT = '''
# %% [markdown] slide=slide
# # Title
#
# Some *prose*.

# %% m11={"exercise": "0.1", "role": "check", "points": 2} tags=["graded"]
x = 1

print(x)
# %% [md] slide=notes id=speaker-notes
# Say this out loud.
# %%
# NBVAL_CHECK_OUTPUT
print(2)
'''


def test_from_percent_builds_cells_with_metadata() -> None:
    nb = from_percent(PERCENT)
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "markdown", "code"]
    title, check, notes, last = nb.cells
    assert title.source == "# Title\n\nSome *prose*."
    assert title.metadata == {"slideshow": {"slide_type": "slide"}}
    assert check.source == "x = 1\n\nprint(x)"
    assert check.metadata == {"m11": {"exercise": "0.1", "role": "check", "points": 2},
                              "tags": ["graded"], "slideshow": {"slide_type": "-"}}
    assert notes.id == "speaker-notes" and notes.metadata["slideshow"] == {"slide_type": "notes"}
    assert last.source.startswith("# NBVAL_CHECK_OUTPUT")
    assert dumps(from_percent(PERCENT)) == dumps(clean(nb))  # deterministic, already clean
    nbformat.validate(nb)


@pytest.mark.parametrize("marker, expected", [
    ("# %% slide=big", "allowed: slide, subslide"),
    ('# %% m11={"exercise": ', "not valid JSON"),
    ("# %% colour=red", "allowed keys"),
    ("# %% [markdown] oops", "expected key=VALUE"),
])
def test_from_percent_rejects_bad_markers_with_line_number(marker: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected) as err:
        from_percent(f"x = 1\n{marker}\ny = 2\n")
    assert str(err.value).startswith("line 2:")


def test_from_percent_cli(tmp_path: Path) -> None:
    src, out = tmp_path / "lesson.py", tmp_path / "out" / "lesson.ipynb"
    src.write_text(PERCENT)
    assert notebooks.main(["--from-percent", str(src), "-o", str(out)]) == 0
    assert is_clean(out) and len(nbformat.read(out, as_version=4).cells) == 4


@pytest.mark.parametrize("folder", ["course", "solutions", "exercises"])
def test_committed_notebooks_are_clean(folder: str) -> None:
    paths = notebooks.find_notebooks([ROOT / folder]) if (ROOT / folder).is_dir() else []
    if not paths:
        pytest.skip(f"no notebooks in {folder}/ yet")
    dirty = [str(p.relative_to(ROOT)) for p in paths if not is_clean(p)]
    assert not dirty, f"run `m11 nbclean {folder}/`: not clean: {dirty}"


def test_fixture_notebooks_are_clean() -> None:
    paths = notebooks.find_notebooks([ROOT / "tests" / "data" / "grading"])
    assert paths and all(is_clean(p) for p in paths)
