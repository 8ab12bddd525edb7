"""Notebook files: Colab badge and setup cell derived from the one REPO_URL, clean outputs."""

import io
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

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


def _run_setup_cell(monkeypatch, on_colab: bool) -> list[list[str]]:
    """Execute the setup cell with subprocess.run recorded instead of run; return its commands."""
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(list(cmd)))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the cell prepends the clone folder
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(course.setup_cell_source(), "setup", "exec"), {})
    return calls


def test_setup_cell_is_inert_outside_colab(monkeypatch):
    assert _run_setup_cell(monkeypatch, on_colab=False) == []
    assert course.colab_url("01_x.ipynb").endswith("/blob/main/notebooks/01_x.ipynb")


def test_setup_cell_clones_repo_url_and_installs_it_on_colab(monkeypatch):
    clone, install = _run_setup_cell(monkeypatch, on_colab=True)
    assert clone[:2] == ["git", "clone"] and course.REPO_URL in clone
    folder = clone[-1]
    assert install[1:] == ["-m", "pip", "install", "-q", "-e", folder]


# ---------------------------------------------------------------------------- the runner
def _tiny_notebook(folder: Path) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import os\nprint(os.environ.get('SEQ_RECORD_RESULTS'), os.environ.get('SEQ_FAST'))")]
    path = folder / "99_tiny.ipynb"
    nbformat.write(nb, path)
    return path


def test_runner_reports_fast_mode_and_lets_the_kernel_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEQ_FAST", "true")  # the case that used to print "full"
    monkeypatch.delenv("SEQ_RECORD_RESULTS", raising=False)
    path = _tiny_notebook(tmp_path)
    assert course.main(["run", str(path)]) == 0
    assert "(fast mode)" in capsys.readouterr().out
    out = "".join(json.loads(path.read_text())["cells"][0]["outputs"][0]["text"])
    assert out.strip() == "1 true", "the kernel sees the runner's SEQ_RECORD_RESULTS=1"
    assert "SEQ_RECORD_RESULTS" not in os.environ, "the runner restores its own environment"


def test_runner_reports_full_mode(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("SEQ_FAST", raising=False)
    monkeypatch.setattr(course, "run", lambda path: 1.0)
    assert course.main(["run", str(_tiny_notebook(tmp_path))]) == 0
    assert "(full mode)" in capsys.readouterr().out


def test_runner_asks_before_running_all_notebooks(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(course, "run", lambda path: ran.append(path) or 1.0)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: nobody to ask
    assert course.main(["run"]) == 1 and ran == []
    assert "--all" in capsys.readouterr().out
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda question: "n")
    assert course.main(["run"]) == 1 and ran == []
    monkeypatch.setattr("builtins.input", lambda question: "y")
    assert course.main(["run"]) == 0 and ran == NOTEBOOKS
    ran.clear()
    assert course.main(["run", "--all"]) == 0 and ran == NOTEBOOKS


def test_runner_resolves_names_and_explains_unknown_ones():
    assert course.resolve("03") == course.resolve("03_recurrent_neural_networks") == NOTEBOOKS[2]
    with pytest.raises(SystemExit, match="choose from: 01_text_preprocessing"):
        course.resolve("99")


@pytest.mark.parametrize("module", ["utils.course", "utils.results"])
def test_both_commands_answer_help(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, cwd=course.REPO_ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m {module}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_readme_lists_every_notebook(path):
    assert f"(notebooks/{path.name})" in (course.REPO_ROOT / "README.md").read_text()


# ---------------------------------------------------------------------------- cross-references
# Topic words a sentence may attach to a "notebook NN" mention. A mention whose context names
# one of them must point at a notebook whose README row (title + what it teaches) names it too.
TOPICS = {
    "translation": r"translat", "attention": r"attention", "LSTM": r"\bLSTM", "GRU": r"\bGRU",
    "Transformer": r"transformer", "BPTT": r"BPTT|backpropagation through time",
    "BLEU": r"\bBLEU", "perplexity": r"perplexit", "n-gram": r"n-gram", "BPE": r"\bBPE",
    "sentiment": r"sentiment", "ViT": r"\bViT\b|vision", "GPT": r"\bGPT", "BERT": r"\bBERT",
    "warm-up": r"warm-?up",
}
MENTION = re.compile(r"\b[Nn]otebooks?\s+(\d\d)((?:\s*(?:,|and|or|–|-)\s*\d\d)*)")


def readme_notebook_rows() -> dict[str, str]:
    """{"01": "title and what it teaches", ...} from the README's notebook table."""
    text = (course.REPO_ROOT / "README.md").read_text()
    table = text[text.index("## Notebooks"):text.index("<!-- notebooks:end -->")]
    return {m[1]: f"{m[2]} {m[3]}" for m in re.finditer(r"^\| (\d\d) \| (.*?) \| (.*?) \|", table, re.M)}


def mention_contexts(text: str):
    """(numbers, context) for each mention: the words just before it, and a parenthesis after."""
    for m in MENTION.finditer(text):
        numbers = [m[1], *re.findall(r"\d\d", m[2])]
        # the clause before it, cut at the previous mention, which has its own context
        # (headings and blank lines end a clause too)
        clause = re.split(r"#[^\n]*\n|\n\s*\n|[.;:|(]\s|[Nn]otebooks?\s+\d\d",
                          text[max(0, m.start() - 80):m.start()])[-1]
        before = " ".join(clause.split()[-6:])  # the last few words name what is referred to
        after = re.match(r"\s*\(([^)]*)\)", text[m.end():])
        yield numbers, before + " " + (after[1] if after else "")


def test_cross_reference_checker_catches_a_wrong_number():
    rows = readme_notebook_rows()
    [(numbers, context)] = mention_contexts("We translate German to English (notebook 06).")
    assert numbers == ["06"] and "translat" in context
    assert not re.search(TOPICS["translation"], rows["06"], re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cross_references_name_the_right_notebook(path):
    rows, wrong = readme_notebook_rows(), []
    assert len(rows) == 12, "the README table lists notebooks 01-12"
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        for numbers, context in mention_contexts("".join(cell["source"])):
            wrong += [f"notebook {n} does not exist: ...{context}" for n in numbers if n not in rows]
            topics = [t for t, pat in TOPICS.items() if re.search(pat, context, re.I)]
            # every topic named must be taught by one of the notebooks mentioned
            if not all(any(re.search(TOPICS[t], rows.get(n, ""), re.I) for n in numbers)
                       for t in topics):
                wrong.append(f"notebook(s) {'/'.join(numbers)} for {topics}: ...{context.strip()}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_displayed_sources_are_current(path):
    """Every `show_source(...)` output shows the code as it is now in utils, not an old copy."""
    from utils.show import shown_sources, source_of

    for cell, args in shown_sources(json.loads(path.read_text())["cells"]):
        call = "".join(cell["source"]).strip()
        outputs = [o["data"]["text/plain"] for o in cell["outputs"] if "text/plain" in o.get("data", {})]
        assert outputs, f"{call} has no output: re-run the notebook"
        assert "".join(outputs[0]).strip() == source_of(*args).strip(), (
            f"{path.name}: the output of {call} is older than the code in utils; "
            f"run `python -m utils.show notebooks/{path.name}`")
