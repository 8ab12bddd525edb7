"""The course's notebooks as files: repository URL, Colab badge and setup cell, executing them.

`REPO_URL` is the one place the repository address lives. Every notebook's Colab badge and
Colab setup cell are generated from it (`python -m utils.course sync`), and a test checks
they agree (`python -m utils.course check`). `python -m utils.course run NB...` executes
notebooks top to bottom in full mode and stores their outputs, as committed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO_URL = "https://github.com/sequence-models-course/sequence-models"
BRANCH = "main"
REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
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


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def _badge_line(cell_source: str) -> str | None:
    return next((ln for ln in cell_source.splitlines() if BADGE_IMAGE in ln), None)


def problems(path: Path) -> list[str]:
    """What is out of sync with REPO_URL in one notebook (empty list: all good)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    found = []
    first_md = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first_md is None or _badge_line(first_md.source) != colab_badge(path.name):
        found.append(f"{path.name}: the first markdown cell lacks the badge {colab_badge(path.name)}")
    setup = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(SETUP_MARKER)]
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
    setup = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(SETUP_MARKER)]
    if setup:
        setup[0].source = setup_cell_source()
    else:
        index = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(index, nbformat.v4.new_code_cell(setup_cell_source()))
    nbformat.write(nb, path)


def run(path: Path, timeout: int = 1800) -> float:
    """Execute a notebook in full mode, top to bottom, storing outputs; returns seconds taken."""
    import nbformat
    from nbconvert.preprocessors import ExecutePreprocessor

    os.environ["SEQ_QUIET"] = "1"  # no progress bars in stored outputs
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    ExecutePreprocessor(timeout=timeout, kernel_name="python3").preprocess(
        nb, {"metadata": {"path": str(path.parent)}}
    )
    for cell in nb.cells:  # keep diffs small: no per-cell timing metadata
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    command, names = (argv[0] if argv else "check"), argv[1:]
    paths = [NOTEBOOKS / n if not n.endswith(".ipynb") else Path(n) for n in names] or notebook_paths()
    paths = [p.with_suffix(".ipynb") for p in paths]
    if command == "sync":
        for p in paths:
            sync(p)
        print(f"synced {len(paths)} notebooks with {REPO_URL}")
    elif command == "check":
        found = [msg for p in paths for msg in problems(p)]
        print("\n".join(found) or f"{len(paths)} notebooks agree with {REPO_URL}")
        return 1 if found else 0
    elif command == "run":
        os.environ.setdefault("SEQ_FAST", "0")
        for p in paths:
            print(f"{p.name}: {run(p):.0f} s ({'fast' if os.environ['SEQ_FAST'] == '1' else 'full'} mode)")
    else:
        print("usage: python -m utils.course [sync|check|run] [notebook ...]")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
