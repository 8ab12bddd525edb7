"""Generated notebook structure: solution tags, slide types, run-time lines; the student edition.

None of this is edited by hand in a notebook. `python -m course meta apply [NB...]`
rewrites the notebooks (all of them by default) and gives the same result when run again, so
run it after re-running a notebook:

1. cells: a markdown cell is split where a heading starts inside it (and, under "Solutions",
   where a solution's `**k.**` marker starts), so every section and every solution begins a
   cell of its own; the text itself is unchanged;
2. solutions: the cells under the "Solutions" heading get the tag `solution` and open collapsed
   in JupyterLab (`jupyter.source_hidden`, `jupyter.outputs_hidden`, and on code cells the
   `collapsed` flag JupyterLab writes beside it);
3. slides: every cell gets a RISE / reveal.js slide type (`slideshow.slide_type`): each `##`
   section a slide, `###` sections, solutions and long stretches sub-slides, training cells
   fragments; bookkeeping skipped (the Colab setup cell, the cells that record results) or in
   the speaker notes (the `cfg = dict(...)` configuration);
4. site: myst-nb tags for the website: the Colab setup cell's code removed from the page
   (`remove-input`), the code of cells that record results behind a toggle (`hide-input`);
5. run time: the header's "**Run time:**" line is written from `notebooks/results/NN_topic.json`;
6. kernel: the kernelspec JupyterLab writes for ipykernel's `python3`, so that opening and
   saving a notebook in JupyterLab leaves it byte-identical (`tests/test_jupyterlab.py`).

`solutions`, `slides`, `site`, `runtime` and `kernel` do one step each (the first two split cells first);
`check` lists what `apply` would change and exits 1 if anything; `student [--out DIR]`
writes the student edition: copies whose solutions are placeholders without outputs, whose
Colab badge opens the student edition; `student --branch` commits it to the branch `student`
(the badge's target; then `git push origin student`).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from course.notebooks import (  # SETUP_MARKER: the setup cell's first line
    BRANCH,
    SETUP_MARKER,
    STUDENT_BRANCH,
    colab_url,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
RESULTS = NOTEBOOKS / "results"
COLAB_LINK = re.compile(r"\]\(https://colab\.research\.google\.com/github/[^)]*\)")  # the badge's target
STUDENT_DIR = REPO_ROOT / "build" / "student"
SOLUTION_TAG = "solution"

HEADING = re.compile(r"(#{1,6})\s+(\S.*)")
MD_MARKER = re.compile(r"\*\*(\d+)\.")  # "**2.** ..." or "**2. Coupled gates.** ..."
CODE_MARKER = re.compile(r"#\s*(\d+)\.\s")  # "# 2. padding fraction ..."
LIST_ITEM = re.compile(r"^(\d+)\.\s", re.M)  # a top-level item of the Exercises list
RUN_TIME = re.compile(r"\*\*Run time\b")
SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")
LINES_PER_SLIDE = 24  # rough height of a 960x700 slide, in lines of text
HEAVY = re.compile(r"(?<![\w.])(fit|fit_for_time|train_\w+|run_arm|run_char_gpt)\s*\(")


# ---------------------------------------------------------------------------- cells
def heading(cell) -> tuple[int, str] | None:
    """(level, text) when a markdown cell starts with a heading."""
    if cell["cell_type"] != "markdown":
        return None
    m = HEADING.match(cell["source"])
    return (len(m.group(1)), m.group(2).strip()) if m else None


def marker(cell) -> int | None:
    """The exercise number a solution cell starts with: `**k.**` (markdown) or `# k.` (code)."""
    m = (MD_MARKER if cell["cell_type"] == "markdown" else CODE_MARKER).match(cell["source"])
    return int(m.group(1)) if m else None


def _split_source(source: str, starts) -> list[str]:
    """Cut markdown before every line (outside code fences) for which `starts(line, prev)`."""
    lines, cuts, fence = source.split("\n"), [0], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif i and not fence and starts(line, lines[i - 1]):
            cuts.append(i)
    pieces = ["\n".join(lines[a:b]).strip("\n") for a, b in zip(cuts, cuts[1:] + [len(lines)])]
    return [p for p in pieces if p.strip()]


def _starts_heading(line: str, prev: str) -> bool:
    return bool(HEADING.match(line))


def _starts_marker(line: str, prev: str) -> bool:
    return bool(MD_MARKER.match(line)) and not prev.strip()


def split_cells(cells: list, starts=_starts_heading, only: set[int] | None = None) -> list:
    """The cells with every markdown cell cut where `starts` says; new pieces get derived ids."""
    out = []
    for i, cell in enumerate(cells):
        pieces = [cell["source"]]
        if cell["cell_type"] == "markdown" and (only is None or i in only):
            pieces = _split_source(cell["source"], starts) or [cell["source"]]
        for n, text in enumerate(pieces):
            piece = cell if n == 0 else copy.deepcopy(cell)
            piece["source"] = text
            if n and "id" in cell:
                piece["id"] = f"{cell['id']}-{n}"[-64:]
            out.append(piece)
    return out


# ---------------------------------------------------------------------------- exercises
@dataclass
class Exercises:
    """Where a notebook's exercises and their worked solutions are (cell indices)."""

    count: int  # items of the numbered list under the "Exercises" heading
    solutions_heading: int | None  # the "Solutions" heading cell
    cells: list[int] = field(default_factory=list)  # every cell of the Solutions section
    groups: dict = field(default_factory=dict)  # exercise number (None: unnumbered) -> cells


def find_exercises(cells: list) -> Exercises | None:
    """The Exercises list and the Solutions section: from the "Solutions" heading to the next
    heading of the same or a higher level (References, Results) or the end. A solution starts
    at its marker (`**k.**` in markdown, `# k.` in code) and runs to the next marker."""
    heads = [(i, h) for i, c in enumerate(cells) if (h := heading(c))]
    ex = next((i for i, (level, text) in heads if text.startswith("Exercises")), None)
    if ex is None:
        return None
    sol = next((i for i, (_, text) in heads if i > ex and text.startswith("Solutions")), None)
    listed = "\n".join(c["source"] for c in cells[ex:sol] if c["cell_type"] == "markdown")
    found = Exercises(max((int(n) for n in LIST_ITEM.findall(listed)), default=0), sol)
    if sol is None:
        return found
    level, current = heading(cells[sol])[0], None
    for i in range(sol + 1, len(cells)):
        h = heading(cells[i])
        if h and h[0] <= level:
            break
        current = marker(cells[i]) or current
        found.cells.append(i)
        found.groups.setdefault(current, []).append(i)
    return found


def normalize_cells(nb) -> None:
    """Step 1: one heading per markdown cell, one solution marker per cell under Solutions."""
    nb["cells"] = split_cells(nb["cells"])
    ex = find_exercises(nb["cells"])
    if ex and ex.solutions_heading is not None:  # "## Solutions\n\n**1.** ..." splits too
        only = {ex.solutions_heading, *ex.cells}
        nb["cells"] = split_cells(nb["cells"], _starts_marker, only)


def tag_solutions(nb) -> None:
    """Step 2: tag the Solutions section `solution`, collapsed in JupyterLab; untag the rest."""
    ex = find_exercises(nb["cells"])
    inside = set(ex.cells) if ex else set()
    for i, cell in enumerate(nb["cells"]):
        meta = cell["metadata"]
        tags = [t for t in meta.get("tags", []) if t != SOLUTION_TAG]
        hidden = {k: v for k, v in meta.get("jupyter", {}).items()
                  if k not in ("source_hidden", "outputs_hidden")}
        meta.pop("collapsed", None)
        if i in inside:
            tags.append(SOLUTION_TAG)
            hidden["source_hidden"] = True
            if cell["cell_type"] == "code":
                hidden["outputs_hidden"] = True
                meta["collapsed"] = True  # JupyterLab writes the old flag beside outputs_hidden
        for key, value in (("tags", tags), ("jupyter", hidden)):
            if value:
                meta[key] = value
            else:
                meta.pop(key, None)


# ---------------------------------------------------------------------------- the website
# myst-nb's cell tags: the setup cell's code is removed from the notebook's page (its output,
# if any, stays), a cell that records results shows its code behind a toggle
SITE_TAGS = ("remove-input", "hide-input")
RECORDS = re.compile(r"(?<![\w.])save_results\s*\(")
CONFIG = re.compile(r"cfg = (dict\(|\{)")  # the run's configuration, first thing in a notebook


def bookkeeping(cell) -> str | None:
    """"setup" (the Colab setup cell), "config" (the run's `cfg = dict(...)`), "record" (a cell
    that writes the results file) or None: cells that serve the run, not the lesson."""
    if cell["cell_type"] != "code":
        return None
    if cell["source"].startswith(SETUP_MARKER):
        return "setup"
    if CONFIG.match(cell["source"]):
        return "config"
    return "record" if RECORDS.search(cell["source"]) else None


def tag_for_site(nb) -> None:
    """Step: SITE_TAGS on the bookkeeping cells (not on solutions), off every other cell."""
    wanted = {"setup": "remove-input", "record": "hide-input"}  # a configuration is the lesson's
    for cell in nb["cells"]:
        meta = cell["metadata"]
        tags = [t for t in meta.get("tags", []) if t not in SITE_TAGS]
        kind = bookkeeping(cell)
        if kind in wanted and SOLUTION_TAG not in tags:
            tags.append(wanted[kind])
        if tags:
            meta["tags"] = tags
        else:
            meta.pop("tags", None)


# ---------------------------------------------------------------------------- slides
def _text_lines(text: str, width: int = 100) -> int:
    return sum(1 + len(line) // width for line in text.split("\n"))


OUTPUT_LINES = 20  # a slide shows at most this many lines of one output (it scrolls past them)


def _html_lines(html: str) -> int:
    """Lines an HTML output takes: the text of its <pre> blocks, or its table rows."""
    html = re.sub(r"<style.*?</style>", "", html, flags=re.S)
    text = re.sub(r"<[^>]+>", "", html)
    return max(html.count("<tr"), sum(1 for line in text.split("\n") if line.strip()))


def output_height(out) -> int:
    """Rough height of one output on a slide, in lines (a long one scrolls in its box)."""
    data = out.get("data", {})
    if "image/png" in data or "image/svg+xml" in data:
        return 16
    if out["output_type"] == "stream":
        return min(_text_lines(out["text"]), OUTPUT_LINES)
    if out["output_type"] == "error":
        return 10
    if "text/html" in data:
        return min(_html_lines(data["text/html"]), OUTPUT_LINES)
    return min(_text_lines(data.get("text/plain", "")), OUTPUT_LINES)


def cell_height(cell) -> int:
    """Rough height of a cell on a slide, in lines: its source plus its outputs."""
    return _text_lines(cell["source"]) + 1 + sum(output_height(o) for o in cell.get("outputs", []))


def slide_types(nb) -> list[str]:
    """One slide type per cell (see the module docstring for the rules)."""
    ex = find_exercises(nb["cells"])
    solution_starts = {cells[0] for cells in ex.groups.values()} if ex else set()
    types, used = [], 0
    for i, cell in enumerate(nb["cells"]):
        h, height = heading(cell), cell_height(cell)
        if i == 0 or (h and h[0] <= 2):
            kind = "slide"
        elif h or i in solution_starts:
            kind = "subslide"
        elif bookkeeping(cell) in ("setup", "record"):
            kind, height = "skip", 0  # serves the run, not the lesson
        elif bookkeeping(cell) == "config":
            kind, height = "notes", 0  # the presenter's view has it
        elif used + height > LINES_PER_SLIDE:
            kind = "subslide"
        elif cell["cell_type"] == "code" and HEAVY.search(cell["source"]):
            kind = "fragment"  # a training run: shown, with its output, on a click
        else:
            kind = "-"
        used = height if kind in ("slide", "subslide") else used + height
        types.append(kind)
    return types


def set_slides(nb) -> None:
    """Step 3: slide metadata on every cell; RISE scrolls slides taller than the screen."""
    for cell, kind in zip(nb["cells"], slide_types(nb)):
        cell["metadata"]["slideshow"] = {"slide_type": kind}
    nb["metadata"]["rise"] = {"scroll": True}


# ---------------------------------------------------------------------------- run time
def duration(seconds: float) -> str:
    """One format for run times: "45 s" under a minute, "3.3 min" above."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def run_time_line(name: str, results: Path = RESULTS) -> str | None:
    """The header's run-time line, from the last full run's results file (None without one)."""
    path = results / f"{name}.json"
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    where = "the CPU" if r["device"] == "cpu" else f"a GPU ({r['device']})"
    line = (f"**Run time:** {duration(r['wall_time_s'])} in full mode on {where} "
            f"(the committed outputs, run on {r['date']})")
    gpu = results / "gpu" / f"{name}.json"
    if gpu.exists():
        g = json.loads(gpu.read_text())
        line += f", {duration(g['wall_time_s'])} on a GPU ({g.get('device_name', g['device'])})"
    line += "; under a minute in fast mode (`SEQ_FAST=1`, what the tests run)."
    return textwrap.fill(line, width=95, break_on_hyphens=False, break_long_words=False)


def set_run_time(nb, name: str, results: Path = RESULTS) -> None:
    """Step 4: replace the header paragraph that starts with "**Run time" (or add one before
    the Colab badge)."""
    line = run_time_line(name, results)
    first = next((c for c in nb["cells"] if c["cell_type"] == "markdown"), None)
    if line is None or first is None:
        return
    paras = first["source"].split("\n\n")
    at = next((i for i, p in enumerate(paras) if RUN_TIME.match(p)), None)
    if at is not None:
        paras[at] = line
    else:
        badge = next((i for i, p in enumerate(paras) if "colab-badge" in p), len(paras))
        paras.insert(badge, line)
    first["source"] = "\n\n".join(paras)


# ---------------------------------------------------------------------------- kernel
# What JupyterLab writes when it saves a notebook whose kernel is ipykernel's `python3`: the same
# here, so opening and saving a notebook leaves the file as it was (git status stays clean).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def set_kernelspec(nb) -> None:
    nb["metadata"]["kernelspec"] = dict(KERNELSPEC)


# ---------------------------------------------------------------------------- commands
STEPS = {
    "solutions": lambda nb, name: (normalize_cells(nb), tag_solutions(nb)),
    "slides": lambda nb, name: (normalize_cells(nb), set_slides(nb)),
    "site": lambda nb, name: tag_for_site(nb),
    "runtime": lambda nb, name: set_run_time(nb, name),
    "kernel": lambda nb, name: set_kernelspec(nb),
}


def update(path: Path, steps=tuple(STEPS), write: bool = True) -> list[str]:
    """Run `steps` on one notebook; returns the steps that changed it (written if `write`)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    changed, text = [], nbformat.writes(nb)
    for step in steps:
        STEPS[step](nb, path.stem)
        new = nbformat.writes(nb)
        if new != text:
            changed.append(step)
            text = new
    if changed and write:
        nbformat.write(nb, path)
    return changed


def student_edition(nb, name: str) -> dict:
    """A copy of `nb` whose solutions are placeholders: per exercise a prompt and an empty
    code cell (no outputs); every other cell, outputs included, unchanged."""
    import nbformat

    nb = copy.deepcopy(nb)
    ex = find_exercises(nb["cells"])
    groups = {cells[0]: k for k, cells in ex.groups.items()} if ex else {}
    cells = []
    for i, cell in enumerate(nb["cells"]):
        if ex is None or i not in ex.cells:
            cells.append(cell)
        elif i in groups:
            k = groups[i]
            label = f"**{k}.**" if k else "**Your solution.**"
            prompt = nbformat.v4.new_markdown_cell(
                f"{label} Try it yourself in the cell below; the worked solution is in "
                f"`notebooks/{name}.ipynb` and on the course website.")
            code = nbformat.v4.new_code_cell(f"# Exercise {k}: your code here" if k else
                                             "# your code here")
            for new, suffix in ((prompt, "q"), (code, "a")):
                new["id"] = f"{cell.get('id', i)}-{suffix}"[-64:]
                new["metadata"] = {"tags": [SOLUTION_TAG], "slideshow": {"slide_type": "-"}}
            cells += [prompt, code]
    nb["cells"] = cells
    title = next((c for c in nb["cells"] if c["cell_type"] == "markdown"), None)
    if title is not None:  # its Colab badge opens the student edition, and it says what it is
        source = "".join(title["source"])
        source, n = COLAB_LINK.subn(f"]({colab_url(name + '.ipynb', STUDENT_BRANCH)})", source)
        title["source"] = source + (
            f"\n\n*Student edition: the exercises' solutions are left for you. The notebook with "
            f"worked solutions: `notebooks/{name}.ipynb` on the `{BRANCH}` branch, and the course website.*")
    return nb


def write_student_edition(paths: list[Path], out: Path = STUDENT_DIR) -> list[Path]:
    import nbformat

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        nb = student_edition(nbformat.read(path, as_version=4), path.stem)
        nbformat.write(nb, out / path.name)
        written.append(out / path.name)
    return written


def publish_student_branch(paths: list[Path], repo: Path = REPO_ROOT, branch: str = STUDENT_BRANCH) -> str:
    """Commit the student edition of `paths` to `branch` of the git repository `repo`, without
    touching its working tree or index: the tree of HEAD with each notebook replaced by its
    student edition, one commit on top of the branch's last (if any). Returns the commit id;
    publish it with `git push origin student`."""
    import nbformat

    def git(*args: str, env: dict | None = None, data: str | None = None) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, input=data,
                              env={**os.environ, **(env or {})})
        if done.returncode:
            raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    head = git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory() as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}  # a private index: the user's stays as it is
        git("read-tree", head, env=env)
        for path in paths:
            text = nbformat.writes(student_edition(nbformat.read(path, as_version=4), path.stem)) + "\n"
            blob = git("hash-object", "-w", "--stdin", data=text)
            rel = Path(path).resolve().relative_to(Path(repo).resolve()).as_posix()
            git("update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
        tree = git("write-tree", env=env)
    parent = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
                            capture_output=True, text=True).stdout.strip()
    commit = git("commit-tree", tree, *(["-p", parent] if parent else []),
                 "-m", f"Student edition of {head[:12]}: solutions blanked (python -m course student --branch)")
    git("update-ref", f"refs/heads/{branch}", commit)
    return commit


def notebook_paths(names: list[str]) -> list[Path]:
    """Notebooks named on the command line ("01", "01_text_preprocessing", a path), or all."""
    if not names:
        return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    paths = []
    for name in names:
        path = Path(name)
        if not path.suffix:
            path = next(iter(sorted(NOTEBOOKS.glob(f"{name}*.ipynb"))), NOTEBOOKS / f"{name}.ipynb")
        if not path.exists():
            raise SystemExit(f"no notebook {name!r} (looked for {path})")
        paths.append(path)
    return paths


def main(argv: list[str]) -> int:
    usage = ("usage: python -m course meta {apply|solutions|slides|site|runtime|kernel|check} [NB ...]\n"
             "       python -m course student [--out DIR | --branch] [NB ...]")
    if argv[:1] == ["student"]:
        usage = ("usage: python -m course student [--out DIR | --branch] [NB ...]  (solutions blanked, to "
                 "build/student/, or committed to the branch 'student' for its Colab badges)")
    if not argv or argv[0] not in (*STEPS, "apply", "check", "student") or {"-h", "--help"} & set(argv):
        print(usage + "\n\n" + __doc__)
        return 0 if {"-h", "--help"} & set(argv) else 2
    command, names = argv[0], argv[1:]
    if command == "student":
        if names[:1] == ["--branch"]:
            paths = notebook_paths(names[1:])
            commit = publish_student_branch(paths)
            print(f"student edition: {len(paths)} notebooks committed to the branch '{STUDENT_BRANCH}' "
                  f"({commit[:12]}); publish it with: git push origin {STUDENT_BRANCH}")
            return 0
        out = STUDENT_DIR
        if names[:1] == ["--out"]:
            out, names = Path(names[1]), names[2:]
        written = write_student_edition(notebook_paths(names), out)
        print(f"student edition: {len(written)} notebooks in {out}")
        return 0
    steps = tuple(STEPS) if command in ("apply", "check") else (command,)
    stale = 0
    for path in notebook_paths(names):
        changed = update(path, steps, write=command != "check")
        stale += bool(changed)
        if changed:
            verb = "out of date" if command == "check" else "updated"
            print(f"{path.name}: {verb} ({', '.join(changed)})")
    if command == "check":
        print("run `python -m course meta apply`" if stale else "all notebooks up to date")
        return 1 if stale else 0
    print(f"{stale} notebooks changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
