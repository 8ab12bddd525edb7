"""Generated notebook structure (course.notebook_meta): every exercise has a marked, executed,
collapsed solution and nothing else is marked; every cell has slide metadata; the run-time
lines come from the results files; the student edition; executing a notebook keeps it all."""

import json
from pathlib import Path

import nbformat
import pytest

from course import notebook_meta as meta

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
APPLY = "run `python -m course meta apply` and commit the notebooks"
# Content only the notebook's author can add: each solution starts with its "**k.**" (or a
# code cell with "# k.") and every exercise has one. Strict: the entry must go once it is fixed.
MISSING_SOLUTIONS: dict[str, str] = {}


def _read(path):
    return nbformat.read(path, as_version=4)


def _ids(paths):
    return [p.stem[:2] for p in paths]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_solutions_are_tagged_collapsed_and_nothing_else_is(path):
    assert meta.update(path, ("solutions",), write=False) == [], APPLY
    nb = _read(path)
    ex = meta.find_exercises(nb.cells)
    assert ex is not None and ex.count >= 3, "an Exercises list of 3 or more"
    assert ex.solutions_heading is not None and ex.cells, "a Solutions section after it"
    for i, cell in enumerate(nb.cells):
        tagged = meta.SOLUTION_TAG in cell.metadata.get("tags", [])
        assert tagged == (i in ex.cells), f"cell {i}: {cell.source[:60]!r}"
        if tagged:
            assert cell.metadata["jupyter"]["source_hidden"] is True
            assert cell.cell_type == "markdown" or cell.metadata["jupyter"]["outputs_hidden"]


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=MISSING_SOLUTIONS[p.stem]))
    if p.stem in MISSING_SOLUTIONS else p for p in NOTEBOOKS], ids=_ids(NOTEBOOKS))
def test_every_exercise_has_a_marked_executed_solution(path):
    nb = _read(path)
    ex = meta.find_exercises(nb.cells)
    assert set(ex.groups) == set(range(1, ex.count + 1)), (
        f"solutions found for exercises {sorted(ex.groups, key=str)} of 1..{ex.count}")
    for k, cells in ex.groups.items():
        code = [nb.cells[i] for i in cells if nb.cells[i].cell_type == "code"]
        assert code and all(c.execution_count for c in code), f"exercise {k}: executed code"
        assert any(c.outputs for c in code), f"exercise {k}: the solution shows a result"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_metadata_is_what_jupyterlab_writes(path):
    """Solution code cells carry `collapsed` beside `outputs_hidden`, and the kernelspec is
    ipykernel's, as JupyterLab writes them (tests/test_jupyterlab.py saves each in JupyterLab)."""
    assert meta.update(path, ("solutions", "kernel"), write=False) == [], APPLY
    nb = _read(path)
    assert nb.metadata.kernelspec == meta.KERNELSPEC
    for cell in nb.cells:
        hidden = cell.metadata.get("jupyter", {}).get("outputs_hidden", False)
        assert cell.metadata.get("collapsed", False) == (cell.cell_type == "code" and hidden)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_every_cell_has_slide_metadata(path):
    nb = _read(path)
    types = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
    assert all(t in meta.SLIDE_TYPES for t in types), APPLY
    assert types[0] == "slide"
    for cell, kind in zip(nb.cells, types):
        if (h := meta.heading(cell)) and h[0] <= 2:
            assert kind == "slide", f"{cell.source[:40]!r} starts a section: a slide"
    assert nb.metadata.get("rise", {}).get("scroll") is True


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_bookkeeping_code_is_tagged_for_the_website(path):
    """Every notebook page opened with ~40 lines of Colab setup code. The setup cell's input is
    removed on the site (`remove-input`, its output kept) and the cells that record results
    show their code behind a toggle (`hide-input`); generated, never written by hand."""
    assert meta.update(path, ("site",), write=False) == [], APPLY
    nb = _read(path)
    tags = {i: set(c.metadata.get("tags", [])) & set(meta.SITE_TAGS) for i, c in enumerate(nb.cells)}
    setup = [i for i, c in enumerate(nb.cells) if c.source.startswith(meta.SETUP_MARKER)]
    assert setup and all(tags[i] == {"remove-input"} for i in setup)
    assert any(t == {"hide-input"} for t in tags.values()), "the cell that records the results"


def test_bookkeeping_tags_follow_the_rules_and_leave_other_tags():
    nb = _toy()
    nb.cells.insert(4, nbformat.v4.new_code_cell('save_results(run, "99_toy", metrics)'))
    nb.cells[3].metadata["tags"] = ["mine", "hide-input"]  # a stale site tag goes, "mine" stays
    meta.normalize_cells(nb)
    meta.tag_solutions(nb)
    meta.tag_for_site(nb)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert tags[1] == ["remove-input"] and tags[3] == ["mine"] and tags[4] == ["hide-input"]
    assert all(not set(t) & set(meta.SITE_TAGS) for i, t in enumerate(tags) if i not in (1, 4))
    again = json.loads(json.dumps(nb))
    meta.tag_solutions(again)
    meta.tag_for_site(again)
    assert again == json.loads(json.dumps(nb))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_run_time_line_comes_from_the_results_file(path):
    assert meta.update(path, ("runtime",), write=False) == [], APPLY
    header = _read(path).cells[0].source
    seconds = json.loads((meta.RESULTS / f"{path.stem}.json").read_text())["wall_time_s"]
    assert f"**Run time:** {meta.duration(seconds)} in full mode" in header
    assert header.count("**Run time") == 1


# ---------------------------------------------------------------------------- the rules
def _toy():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [
        md("# 99 · Toy\n\nA header.\n\n**Run time:** about forever.\n\n[![Open In Colab](x.svg)](y)"),
        code(meta.SETUP_MARKER + " clone the course"),
        md("## 1. A section\n\nText."),
        code("history = fit(model, batches)", outputs=[nbformat.v4.new_output(
            "stream", text="epoch 1\n")], execution_count=1),
        md("Interpretation.\n\n## Exercises\n\n1. First.\n2. Second.\n\n## Solutions\n\n**1.** Easy:"),
        code("1 + 1", execution_count=2, outputs=[nbformat.v4.new_output(
            "execute_result", data={"text/plain": "2"}, execution_count=2)]),
        md("Because.\n\n**2.** Also easy:"),
        code("2 + 2", execution_count=3),
        md("So.\n\n## References\n\n- A paper."),
    ]
    return nbformat.v4.new_notebook(cells=cells)


def test_cells_are_split_at_headings_and_markers_once():
    nb = _toy()
    meta.normalize_cells(nb)
    sources = [c.source for c in nb.cells]
    assert sources[4:] == ["Interpretation.", "## Exercises\n\n1. First.\n2. Second.",
                           "## Solutions", "**1.** Easy:", "1 + 1", "Because.", "**2.** Also easy:",
                           "2 + 2", "So.", "## References\n\n- A paper."]
    ids = [c.id for c in nb.cells]
    assert len(set(ids)) == len(ids)
    again = json.loads(json.dumps(nb))
    meta.normalize_cells(again)
    assert again == json.loads(json.dumps(nb))


def test_solution_groups_tags_and_slides():
    nb = _toy()
    meta.normalize_cells(nb)
    meta.tag_solutions(nb)
    ex = meta.find_exercises(nb.cells)
    assert ex.count == 2 and ex.groups == {1: [7, 8, 9], 2: [10, 11, 12]}
    tagged = [i for i, c in enumerate(nb.cells) if "solution" in c.metadata.get("tags", [])]
    assert tagged == list(range(7, 13))
    assert nb.cells[8].metadata.jupyter == {"source_hidden": True, "outputs_hidden": True}
    meta.set_slides(nb)
    kinds = [c.metadata.slideshow.slide_type for c in nb.cells]
    assert kinds[:4] == ["slide", "skip", "slide", "fragment"]  # title, setup, section, training
    assert kinds[5] == kinds[6] == kinds[13] == "slide" and kinds[7] == kinds[10] == "subslide"


def test_run_time_line_has_one_format(tmp_path):
    (tmp_path / "gpu").mkdir()
    record = {"wall_time_s": 83.5, "device": "cpu", "date": "2026-11-22"}
    (tmp_path / "99_toy.json").write_text(json.dumps(record))
    line = meta.run_time_line("99_toy", tmp_path)
    assert line.startswith("**Run time:** 1.4 min in full mode on the CPU")
    assert "2026-11-22" in line and "`SEQ_FAST=1`" in line
    (tmp_path / "gpu" / "99_toy.json").write_text(json.dumps({**record, "wall_time_s": 9.2,
                                                              "device": "cuda"}))
    assert "9 s on a GPU (cuda)" in " ".join(meta.run_time_line("99_toy", tmp_path).split())
    (tmp_path / "gpu" / "99_toy.json").write_text(json.dumps({**record, "wall_time_s": 9.2, "device": "cuda",
                                                              "device_name": "NVIDIA H200"}))
    assert "9 s on a GPU (NVIDIA H200)" in " ".join(meta.run_time_line("99_toy", tmp_path).split())
    nb = _toy()
    meta.set_run_time(nb, "99_toy", tmp_path)
    assert "about forever" not in nb.cells[0].source and "**Run time:** 1.4 min" in nb.cells[0].source
    assert meta.run_time_line("98_missing", tmp_path) is None


def test_student_edition_blanks_the_solutions_only():
    nb = _toy()
    meta.normalize_cells(nb)
    meta.tag_solutions(nb)
    student = meta.student_edition(nb, "99_toy")
    sources = [c.source for c in student.cells]
    assert "1 + 1" not in sources and "2 + 2" not in sources and "Because." not in sources
    assert "# Exercise 1: your code here" in sources and "# Exercise 2: your code here" in sources
    placeholders = [c for c in student.cells if c.cell_type == "code" and "Exercise" in c.source]
    assert all(not c.outputs and c.execution_count is None for c in placeholders)
    assert student.cells[3].outputs == nb.cells[3].outputs  # other outputs stay
    assert "## References\n\n- A paper." in sources and nb.cells[8].source == "1 + 1"


def test_student_edition_command_writes_every_notebook(tmp_path):
    assert meta.main(["student", "--out", str(tmp_path)]) == 0
    written = sorted(tmp_path.glob("*.ipynb"))
    assert [p.name for p in written] == [p.name for p in NOTEBOOKS]
    for path in written:
        nb = _read(path)
        solutions = [c for c in nb.cells if meta.SOLUTION_TAG in c.metadata.get("tags", [])]
        assert solutions and all(c.cell_type == "markdown" or not c.outputs for c in solutions)


def test_the_student_editions_colab_badge_opens_the_student_edition():
    from course.notebooks import STUDENT_BRANCH, colab_url

    nb = _read(NOTEBOOKS[0])
    student = meta.student_edition(nb, NOTEBOOKS[0].stem)
    title = student.cells[0].source
    assert f"]({colab_url(NOTEBOOKS[0].name, STUDENT_BRANCH)})" in title and "/blob/main/" not in title
    assert "Student edition" in title and nb.cells[0].source in title.replace(STUDENT_BRANCH, "main")


def test_publishing_the_student_branch_leaves_the_working_tree_and_index_alone(tmp_path, monkeypatch):
    """`python -m course student --branch`: the Colab badges point at this branch."""
    import shutil
    import subprocess

    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "t")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "t@t")

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    (tmp_path / "notebooks").mkdir()
    source = tmp_path / "notebooks" / NOTEBOOKS[0].name
    shutil.copy(NOTEBOOKS[0], source)
    git("init", "-q", "-b", "main")
    git("add", ".")
    git("commit", "-qm", "course")
    before = (source.read_bytes(), git("status", "--porcelain"), git("rev-parse", "HEAD"))
    first = meta.publish_student_branch([source], repo=tmp_path)
    second = meta.publish_student_branch([source], repo=tmp_path)
    assert (source.read_bytes(), git("status", "--porcelain"), git("rev-parse", "HEAD")) == before
    assert git("rev-parse", "student") == second and git("rev-parse", "student^") == first
    published = nbformat.reads(git("show", f"student:notebooks/{source.name}"), as_version=4)
    assert "Student edition" in published.cells[0].source
    solutions = [c for c in published.cells if meta.SOLUTION_TAG in c.metadata.get("tags", [])]
    assert solutions and all(c.cell_type == "markdown" or not c.outputs for c in solutions)


def test_executing_a_notebook_keeps_its_metadata(tmp_path):
    """`python -m course run` re-executes notebooks; tags, slide types and collapsed
    cells must survive it (only the per-cell timing metadata is dropped)."""
    from course.notebooks import run

    nb = _toy()
    nb.cells = [nb.cells[0], nbformat.v4.new_code_cell("print(6 * 7)")]
    nb.cells[1].metadata.update({"tags": ["solution"], "jupyter": {"source_hidden": True},
                                 "slideshow": {"slide_type": "fragment"}})
    path = tmp_path / "99_toy.ipynb"
    nbformat.write(nb, path)
    run(path, timeout=120)
    cell = _read(path).cells[1]
    assert cell.outputs[0].text == "42\n"
    assert cell.metadata == nb.cells[1].metadata


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_placeholder_is_left_in_the_prose(path):
    """Prose is rewritten from a full run's numbers; a "TODO" marker means it was not."""
    left = [i for i, cell in enumerate(_read(path).cells)
            if cell.cell_type == "markdown" and "TODO" in cell.source]
    assert not left, f"{path.name}: cells {left} still carry a TODO marker; rewrite them from the run"


def test_notebook_code_lines_fit_the_site_column():
    """The website sets code at 12.5 px in a column where a 120-character line fits, also inside
    a solution box (tests/test_site.py checks the pages themselves)."""
    import json
    from pathlib import Path

    long = [f"{p.name[:2]}: {line.strip()[:50]}"
            for p in sorted(Path(__file__).resolve().parent.parent.glob("notebooks/[0-9][0-9]_*.ipynb"))
            for cell in json.loads(p.read_text())["cells"] if cell["cell_type"] == "code"
            for line in "".join(cell["source"]).splitlines() if len(line) > 120]
    assert not long, f"code lines over 120 characters: {long}"
