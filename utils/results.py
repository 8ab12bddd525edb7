"""Headline numbers of each notebook's full run: recorded at its end, read by later notebooks.

A notebook ends with `save_results(run, "01_text_preprocessing", metrics={...}, sizes={...})`.
In full mode, run by the course's runner (`python -m course run`, which sets
`SEQ_RECORD_RESULTS=1`), that writes the tracked `notebooks/results/01_text_preprocessing.json`.
A full run anywhere else (a student's JupyterLab or Colab) writes its numbers beside them, to
the git-ignored `notebooks/results/local/`, so it never changes the committed results. In fast
mode it only says it skipped.

A notebook that builds on another one reads that notebook's record with `load_results` or
`load_metrics`. Every value it reads is noted, and `save_results` writes the notes into the
reader's own record under "reads": when the upstream notebook runs again and its numbers change,
a test (`course.results.stale_reads`) names the readers whose outputs now show old numbers, in
the order to re-run them. The results tables and that check are the course machinery
(`course.results`), not part of this module.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import platform
import re
from pathlib import Path

import torch

from utils.settings import Run

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "notebooks" / "results"  # tracked: the committed full runs
LOCAL_DIR = RESULTS_DIR / "local"  # git-ignored: full runs made outside the runner
GPU_DIR = RESULTS_DIR / "gpu"  # tracked: full runs of the same notebooks on a GPU machine
RECORD_ENV = "SEQ_RECORD_RESULTS"  # "1": this run may write RESULTS_DIR (set by the runner)
KEYS = "<keys>"  # the name under which a read of a record's key list is noted


def _number(value):
    """A Python float/int for a numpy scalar or one-element tensor; anything else unchanged."""
    return value.item() if hasattr(value, "item") else value


def _plain(value):
    """Numbers as JSON-safe Python floats/ints (tensors and numpy scalars included)."""
    value = _number(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def fingerprint(metrics: dict) -> str:
    """A short digest of a metrics dict as the results file stores it. `save_results` prints it,
    so a value edited by hand in the file no longer matches the run's own output."""
    text = json.dumps({k: _plain(v) for k, v in metrics.items()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------- reads of other runs
_READS: dict[str, dict[str, object]] = {}  # source ("06_sentiment_model_zoo") -> {path: value}


class _NotedRecord(dict):
    """A results record (or its "metrics"/"dataset_sizes" part) that notes each value read
    from it, as "metrics.test_acc" -> 0.905, in `_READS[source]`. A missing key is noted as
    None, and a loop over the keys notes the key list: the reader's output depends on both."""

    def __init__(self, data: dict, source: str, prefix: str = ""):
        super().__init__(data)
        self._source, self._prefix = source, prefix

    def _note(self, key, value) -> None:
        _READS.setdefault(self._source, {})[f"{self._prefix}{key}"] = value

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if isinstance(value, dict):
            return _NotedRecord(value, self._source, f"{self._prefix}{key}.")
        self._note(key, value)
        return value

    def get(self, key, default=None):
        if super().__contains__(key):
            return self[key]
        self._note(key, None)
        return default

    def __contains__(self, key) -> bool:
        found = super().__contains__(key)
        if found:
            self[key]  # noqa: B018 (notes the value)
        else:
            self._note(key, None)
        return found

    def __iter__(self):
        self._note(KEYS, sorted(super().keys()))
        return super().__iter__()

    def keys(self):
        return list(iter(self))

    def items(self):
        return [(k, self[k]) for k in self]

    def values(self):
        return [self[k] for k in self]


def reads() -> dict[str, dict[str, object]]:
    """What this process has read from other notebooks' records so far: source -> {path: value}."""
    return {source: dict(values) for source, values in _READS.items()}


def _source_name(notebook: str, results_dir: Path) -> str:
    """"06_sentiment_model_zoo" for the committed results, "gpu/11_..." for the GPU runs."""
    try:
        folder = results_dir.resolve().relative_to(RESULTS_DIR.resolve()).as_posix()
    except ValueError:
        folder = str(results_dir)
    return notebook if folder == "." else f"{folder}/{notebook}"


def load_results(notebook: str, results_dir: str | Path | None = None) -> dict | None:
    """The whole record of another notebook's last full run ("metrics", "dataset_sizes",
    "wall_time_s", ...), or None if it has none. Every value read from it is noted for this
    run's own record (see the module docstring). `results_dir` may be a string."""
    folder = Path(results_dir or RESULTS_DIR)
    path = folder / f"{notebook}.json"
    source = _source_name(notebook, folder)
    if not path.exists():
        _READS.setdefault(source, {})["<record>"] = None  # absent: a later run may add it
        return None
    return _NotedRecord(json.loads(path.read_text()), source)


def load_metrics(notebook: str, results_dir: str | Path | None = None) -> dict | None:
    """Metrics of another notebook's last full run (e.g. baselines to beat), or None if absent."""
    record = load_results(notebook, results_dir)
    return None if record is None else record["metrics"]


# ---------------------------------------------------------------------------- this run's record
def save_results(run: Run, notebook: str, metrics: dict, sizes: dict | None = None,
                 results_dir: str | Path | None = None) -> Path | None:
    """Record a full run's metrics (name -> number), dataset sizes and the values it read from
    other notebooks' records; skipped in fast mode.

    Written to `results_dir` if given, else to RESULTS_DIR under the runner, else LOCAL_DIR.
    `metrics` is turned into plain Python numbers in place (numpy scalars and tensors
    included). It prints the count, the file and the metrics' fingerprint, not the metrics:
    each value is printed where the notebook computes it.
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
        **({"reads": read} if (read := {s: {k: _plain(v) for k, v in r.items()}
                                        for s, r in reads().items() if s != notebook}) else {}),
    }
    path = Path(results_dir or _target_dir()) / f"{notebook}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    where = f"results/local/{path.name}" if path.parent == LOCAL_DIR else f"results/{path.name}"
    said = f"; {sum(map(len, read.values()))} values read from {', '.join(read)}" if read else ""
    print(f"recorded {len(metrics)} metrics to {where} (fingerprint {fingerprint(metrics)}){said}")
    if path.parent == LOCAL_DIR:
        print(f"(your run; the committed results/{path.name} change only through `python -m course run`)")
    return path


def _target_dir() -> Path:
    """The tracked results when the course's runner asks for them, else the git-ignored copy."""
    return RESULTS_DIR if os.environ.get(RECORD_ENV, "").strip() == "1" else LOCAL_DIR
