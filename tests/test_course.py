"""Notebook files: Colab badge and setup cell derived from the one REPO_URL, clean outputs."""

import json

import pytest

from utils import course

NOTEBOOKS = course.notebook_paths()


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badge_and_setup_cell_agree_with_repo_url(path):
    assert course.problems(path) == [], "run `python -m utils.course sync`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_are_clean(path):
    """Executed top to bottom once (counts 1..N), no errors, no home paths in outputs."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "re-run with `python -m utils.course run`"
    text = json.dumps([c["outputs"] for c in code])
    assert '"output_type": "error"' not in text
    for leak in ("/root/", "/home/", "/work/", "/Users/"):
        assert leak not in text, f"output mentions a local path ({leak})"


def test_setup_cell_is_inert_outside_colab():
    namespace: dict = {}
    exec(compile(course.setup_cell_source(), "setup", "exec"), namespace)  # must not clone
    assert course.REPO_URL in course.setup_cell_source()
    assert course.colab_url("01_x.ipynb").endswith("/blob/main/notebooks/01_x.ipynb")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_readme_lists_every_notebook(path):
    assert f"(notebooks/{path.name})" in (course.REPO_ROOT / "README.md").read_text()
