"""The course's notebooks as files: repository URL, Colab badge and setup cell, executing them.

`REPO_URL` is the one place the repository address lives. Every notebook's Colab badge and
Colab setup cell are generated from it (`python -m utils.course sync`), and a test checks
they agree (`python -m utils.course check`). A fork changes `REPO_URL` (and `BRANCH`), then
syncs. `python -m utils.course run NB...` executes notebooks top to bottom and stores their
outputs and results, as committed (`--help` for the options).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# A fork changes these two lines, then runs `python -m utils.course sync` and commits.
REPO_URL = "https://github.com/sequence-models-course/sequence-models"
BRANCH = "main"

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
RESULTS = NOTEBOOKS / "results"
SETUP_MARKER = "# Colab only:"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

def colab_url(notebook: str) -> str:
    path = REPO_URL.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/{BRANCH}/notebooks/{notebook}"


def colab_badge(notebook: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(notebook)})"


def setup_cell_source() -> str:
    """First code cell of every notebook: installs the course on Colab, does nothing elsewhere."""
    return f'''{SETUP_MARKER} clone the course and install it. Elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    import subprocess

    repo, folder = "{REPO_URL}", "/content/sequence-models"
    subprocess.run(["git", "clone", "-q", "--depth", "1", repo, folder], check=False)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", folder], check=True)
    sys.path.insert(0, folder)  # an editable install is only seen after a kernel restart'''


# ---------------------------------------------------------------------------- notebook files
def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def _badge_line(cell_source: str) -> str | None:
    return next((ln for ln in cell_source.splitlines() if BADGE_IMAGE in ln), None)


def _setup_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(SETUP_MARKER)]


def problems(path: Path) -> list[str]:
    """What is out of sync with REPO_URL in one notebook (empty list: all good)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    found = []
    first_md = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first_md is None or _badge_line(first_md.source) != colab_badge(path.name):
        found.append(f"{path.name}: the first markdown cell lacks the badge {colab_badge(path.name)}")
    setup = _setup_cells(nb)
    if not setup or setup[0].source != setup_cell_source():
        found.append(f"{path.name}: the Colab setup cell differs from utils.course.setup_cell_source()")
    first_code = next((c for c in nb.cells if c.cell_type == "code"), None)
    if setup and first_code is not setup[0]:
        found.append(f"{path.name}: the Colab setup cell must be the first code cell")
    return found


def sync(path: Path) -> None:
    """Rewrite the badge and the Colab setup cell of a notebook from REPO_URL."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    first_md = next(c for c in nb.cells if c.cell_type == "markdown")
    old = _badge_line(first_md.source)
    badge = colab_badge(path.name)
    first_md.source = first_md.source.replace(old, badge) if old else f"{first_md.source}\n\n{badge}"
    setup = _setup_cells(nb)
    if setup:
        setup[0].source = setup_cell_source()
    else:
        index = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(index, nbformat.v4.new_code_cell(setup_cell_source()))
    nbformat.write(nb, path)


# ---------------------------------------------------------------------------- the runner
def run(path: Path, timeout: int = 1800) -> float:
    """Execute a notebook top to bottom in the current mode, storing its outputs and letting
    `save_results` write the tracked notebooks/results/*.json; returns seconds taken."""
    import nbformat
    from nbconvert.preprocessors import ExecutePreprocessor

    from utils.results import RECORD_ENV

    nb = nbformat.read(path, as_version=4)
    saved = {k: os.environ.get(k) for k in ("SEQ_QUIET", RECORD_ENV)}
    os.environ.update({"SEQ_QUIET": "1", RECORD_ENV: "1"})  # the kernel inherits both
    start = time.perf_counter()
    try:
        ExecutePreprocessor(timeout=timeout, kernel_name="python3").preprocess(
            nb, {"metadata": {"path": str(path.parent)}}
        )
    finally:
        _restore_env(saved)
    for cell in nb.cells:  # keep diffs small: no per-cell timing metadata
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def _restore_env(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def resolve(name: str) -> Path:
    """A notebook from a path, a file name, a stem or its number ("03")."""
    direct = Path(name)
    if direct.suffix == ".ipynb" and direct.exists():
        return direct
    matches = [p for p in notebook_paths() if p.name == name or p.stem == name
               or p.name.startswith(f"{name}_")]
    if len(matches) != 1:
        choices = ", ".join(p.stem for p in notebook_paths())
        raise SystemExit(f"no single notebook matches {name!r}; choose from: {choices}")
    return matches[0]


def _last_full_runs_min(paths: list[Path]) -> float:
    """Minutes the last recorded full runs of these notebooks took, from notebooks/results."""
    records = [RESULTS / f"{p.stem}.json" for p in paths]
    return sum(json.loads(r.read_text())["wall_time_s"] for r in records if r.exists()) / 60


def confirm_all(paths: list[Path], mode: str) -> bool:
    """Ask before a run that overwrites every notebook; refuse when nobody can answer."""
    question = (f"Run all {len(paths)} notebooks in {mode} mode, overwriting their stored outputs "
                f"and results (the last full runs took {_last_full_runs_min(paths):.0f} min on a "
                "2-core CPU)? [y/N] ")
    if not sys.stdin.isatty():
        print("`run` without notebook names runs all of them: pass --all to confirm, or name "
              "the notebooks (e.g. `python -m utils.course run 03`).")
        return False
    return input(question).strip().lower() in {"y", "yes"}


def run_command(names: list[str], all_confirmed: bool) -> int:
    from utils.settings import is_fast  # the same reading of SEQ_FAST as the notebooks

    mode = "fast" if is_fast() else "full"
    paths = [resolve(n) for n in names] or notebook_paths()
    if not names and not all_confirmed and not confirm_all(paths, mode):
        return 1
    if mode == "fast":
        print("fast mode (SEQ_FAST is set): the stored outputs will be a quick run's, not the "
              "committed full run's; results are not recorded")
    for p in paths:
        print(f"{p.name}: {run(p):.0f} s ({mode} mode)", flush=True)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m utils.course",
        description=f"The course's notebooks as files. Repository: {REPO_URL} ({BRANCH}).")
    sub = parser.add_subparsers(dest="command", metavar="{check,sync,run}")
    helps = {
        "check": "check that badges and Colab setup cells agree with REPO_URL (the default)",
        "sync": "rewrite every badge and Colab setup cell from REPO_URL",
        "run": "execute notebooks top to bottom in the mode SEQ_FAST sets (full by default), "
               "storing outputs and recording notebooks/results/*.json",
    }
    for command, text in helps.items():
        p = sub.add_parser(command, help=text, description=text)
        p.add_argument("notebooks", nargs="*",
                       help="paths, names or numbers (e.g. 03); none: all notebooks")
    sub.choices["run"].add_argument("--all", action="store_true",
                                    help="with no names, run all notebooks without asking")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command, names = args.command or "check", getattr(args, "notebooks", [])
    if command == "run":
        return run_command(names, args.all)
    paths = [resolve(n) for n in names] or notebook_paths()
    if command == "sync":
        for p in paths:
            sync(p)
        print(f"synced {len(paths)} notebooks with {REPO_URL}")
        return 0
    found = [msg for p in paths for msg in problems(p)]
    print("\n".join(found) or f"{len(paths)} notebooks agree with {REPO_URL}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
