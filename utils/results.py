"""Headline numbers of each notebook's last full run, and the README table built from them.

A notebook ends with `save_results(run, "01_text_preprocessing", metrics={...}, sizes={...})`.
In full mode, run by the course's runner (`python -m utils.course run`, which sets
`SEQ_RECORD_RESULTS=1`), that writes the tracked `notebooks/results/01_text_preprocessing.json`.
A full run anywhere else (a student's JupyterLab or Colab) writes its numbers beside them, to
the git-ignored `notebooks/results/local/`, so it never changes the committed results or
breaks the README table test. In fast mode it only says it skipped. `python -m utils.results`
rewrites the README results table from the tracked files; a test keeps the two in sync.

Full runs made on a GPU machine (../shared/gpu/README.md) are copied by hand, unchanged, into
`notebooks/results/gpu/` under the same keys; the README's second table sets each beside the
committed CPU run, so a reader sees what carries across devices (losses, accuracies, BLEU) and
what does not (wall times, speed-ups).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import sys
from pathlib import Path

import torch

from utils.settings import Run, marked_section, replace_marked_section

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "notebooks" / "results"  # tracked: the committed full runs
LOCAL_DIR = RESULTS_DIR / "local"  # git-ignored: full runs made outside the runner
GPU_DIR = RESULTS_DIR / "gpu"  # tracked: full runs of the same notebooks on a GPU machine
RECORD_ENV = "SEQ_RECORD_RESULTS"  # "1": this run may write RESULTS_DIR (set by the runner)
README = REPO_ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
GPU_START, GPU_END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"
MAX_SHOWN = 8  # metrics per notebook in the README; the JSON file has them all


def _number(value):
    """A Python float/int for a numpy scalar or one-element tensor; anything else unchanged."""
    return value.item() if hasattr(value, "item") else value


def _plain(value):
    """Numbers as JSON-safe Python floats/ints (tensors and numpy scalars included)."""
    value = _number(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def save_results(run: Run, notebook: str, metrics: dict, sizes: dict | None = None,
                 results_dir: str | Path | None = None) -> Path | None:
    """Record a full run's metrics (name -> number) and dataset sizes; skipped in fast mode.

    Written to `results_dir` if given, else to RESULTS_DIR under the runner, else LOCAL_DIR.
    `metrics` is turned into plain Python numbers in place (numpy scalars and tensors
    included), so a notebook that displays it afterwards shows `0.8473`, the recorded value,
    not `np.float64(0.8473)`.
    """
    if not re.fullmatch(r"\d\d_[a-z0-9_]+", notebook):
        raise ValueError(f"notebook must look like '01_text_preprocessing', got {notebook!r}")
    metrics.update((k, _number(v)) for k, v in metrics.items())
    if run.fast:
        print(f"fast mode: results not recorded (a full run writes results/{notebook}.json)")
        return None
    record = {
        "notebook": notebook,
        "date": dt.date.today().isoformat(),
        "mode": run.mode,
        "device": str(run.device),
        **({"device_name": torch.cuda.get_device_name(run.device)}  # which GPU: they differ 10x
           if torch.device(run.device).type == "cuda" else {}),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "wall_time_s": round(run.elapsed(), 1),
        "dataset_sizes": {k: _plain(v) for k, v in (sizes or {}).items()},
        "metrics": {k: _plain(v) for k, v in metrics.items()},
    }
    path = Path(results_dir or _target_dir()) / f"{notebook}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    if path.parent == LOCAL_DIR:
        print(f"recorded {len(metrics)} metrics to results/local/{path.name} (your run; the "
              f"committed results/{path.name} change only through `python -m utils.course run`)")
    else:
        print(f"recorded {len(metrics)} metrics to results/{path.name}")
    return path


def _target_dir() -> Path:
    """The tracked results when the course's runner asks for them, else the git-ignored copy."""
    return RESULTS_DIR if os.environ.get(RECORD_ENV, "").strip() == "1" else LOCAL_DIR


def load_results(notebook: str, results_dir: str | Path | None = None) -> dict | None:
    """The whole record of another notebook's last full run ("metrics", "dataset_sizes",
    "wall_time_s", ...), or None if it has none. `results_dir` may be a string, as in `save_results`."""
    path = Path(results_dir or RESULTS_DIR) / f"{notebook}.json"
    return json.loads(path.read_text()) if path.exists() else None


def load_metrics(notebook: str, results_dir: str | Path | None = None) -> dict | None:
    """Metrics of another notebook's last full run (e.g. baselines to beat), or None if absent."""
    record = load_results(notebook, results_dir)
    return None if record is None else record["metrics"]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_table(results_dir: Path | None = None) -> str:
    """The README results table: one row per notebook, its first metrics in one cell."""
    rows = [
        "| notebook | results of the last full run | wall time | device | date |",
        "|---|---|---|---|---|",
    ]
    for path in sorted((results_dir or RESULTS_DIR).glob("*.json")):
        r = json.loads(path.read_text())
        shown = list(r["metrics"].items())[:MAX_SHOWN]
        metrics = "<br>".join(f"{k} = {_fmt(v)}" for k, v in shown)
        if len(r["metrics"]) > MAX_SHOWN:
            more = len(r["metrics"]) - MAX_SHOWN
            metrics += f"<br>[+{more} more](notebooks/results/{path.name})"
        minutes = r["wall_time_s"] / 60
        rows.append(f"| {r['notebook']} | {metrics} | {minutes:.1f} min | {r['device']} | {r['date']} |")
    return "\n".join(rows)


def render_gpu_table(gpu_dir: Path | None = None, cpu_dir: Path | None = None) -> str:
    """The README's GPU table: each full run in `gpu_dir` beside the committed CPU run of the
    same notebook, metric by metric ("GPU value (CPU value)")."""
    rows = [
        "| notebook | GPU run (CPU run) | wall time GPU (CPU) | device | date |",
        "|---|---|---|---|---|",
    ]
    for path in sorted((gpu_dir or GPU_DIR).glob("*.json")):
        gpu = json.loads(path.read_text())
        cpu = load_results(path.stem, cpu_dir) or {"metrics": {}, "wall_time_s": math.nan}
        shown = list(gpu["metrics"].items())[:MAX_SHOWN]
        metrics = "<br>".join(f"{k} = {_fmt(v)} ({_fmt(cpu['metrics'].get(k, '-'))})" for k, v in shown)
        if len(gpu["metrics"]) > MAX_SHOWN:
            metrics += f"<br>[all {len(gpu['metrics'])}](notebooks/results/gpu/{path.name})"
        device = gpu["device"] + (f" ({gpu['device_name']})" if "device_name" in gpu else "")
        rows.append(f"| {gpu['notebook']} | {metrics} | {gpu['wall_time_s'] / 60:.1f} min "
                    f"({cpu['wall_time_s'] / 60:.1f} min) | {device} | {gpu['date']} |")
    return "\n".join(rows)


def readme_section(readme: Path = README) -> str:
    return marked_section(readme, START, END)


def readme_gpu_section(readme: Path = README) -> str:
    return marked_section(readme, GPU_START, GPU_END)


def update_readme(readme: Path = README) -> None:
    replace_marked_section(readme, START, END, render_table())
    replace_marked_section(readme, GPU_START, GPU_END, render_gpu_table())


def main(argv: list[str]) -> int:
    argparse.ArgumentParser(
        prog="python -m utils.results",
        description="Rewrite the README results tables from the committed notebooks/results/*.json "
                    "(the last full runs made by `python -m utils.course run`) and "
                    "notebooks/results/gpu/*.json (the same notebooks run on a GPU machine).",
    ).parse_args(argv)
    update_readme()
    print(f"README results tables rewritten from {len(list(RESULTS_DIR.glob('*.json')))} files "
          f"and {len(list(GPU_DIR.glob('*.json')))} GPU runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
