"""The course's results as a whole: the results tables built from every notebook's record, and
the check that no notebook shows numbers another notebook's run no longer has.

`python -m course results` rewrites the README's results table and the "full run" column of
its notebook table from the committed `notebooks/results/*.json` (the last full runs made by
`python -m course run`), and the GPU table of the page "Running the course" (site/running.md)
from `notebooks/results/gpu/*.json` (the same notebooks run on a GPU machine, copied there by
hand under the same keys, so a reader sees what carries across devices and what does not).
`python -m course reads` lists the recorded reads that are stale and the order to re-run.

A notebook's record holds, under "reads", every value it read from another record
(`utils.results.load_results`); `stale_reads` compares each with the upstream file today.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from utils.results import GPU_DIR, KEYS, RESULTS_DIR
from utils.settings import marked_section, replace_marked_section

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
README = REPO_ROOT / "README.md"
GPU_PAGE = REPO_ROOT / "site" / "running.md"  # the website's "Running the course" page
START, END = "<!-- results:start -->", "<!-- results:end -->"
GPU_START, GPU_END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"
MAX_SHOWN = 4  # metrics per notebook in the README; the JSON file has them all
# a row of the README's notebook table: | 01 | [Title](notebooks/01_x.ipynb) | teaches | full run | data |
NOTEBOOK_ROW = re.compile(r"^(\| \d\d \| \[[^\]]+\]\(notebooks/(\d\d_[a-z0-9_]+)\.ipynb\) \| [^|]+ \| )"
                          r"([^|]+)( \| [^|]+ \|)$", re.M)


def stored_record(notebook: str, results_dir: Path | None = None) -> dict | None:
    """A record as stored (not through utils.results.load_results, which notes reads)."""
    path = Path(results_dir or RESULTS_DIR) / f"{notebook}.json"
    return json.loads(path.read_text()) if path.exists() else None


# ---------------------------------------------------------------------------- README tables
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


def render_gpu_table(gpu_dir: Path | None = None, cpu_dir: Path | None = None,
                     link: str = "../notebooks/results/gpu/") -> str:
    """The GPU table of the page "Running the course" (site/running.md): each full run in
    `gpu_dir` beside the committed CPU run of the same notebook, metric by metric ("GPU value
    (CPU value)"); `link` leads from that page to the record."""
    rows = [
        "| notebook | GPU run (CPU run) | wall time GPU (CPU) | device | date |",
        "|---|---|---|---|---|",
    ]
    for path in sorted((gpu_dir or GPU_DIR).glob("*.json")):
        gpu = json.loads(path.read_text())
        cpu = stored_record(path.stem, cpu_dir) or {"metrics": {}, "wall_time_s": math.nan}
        shown = list(gpu["metrics"].items())[:MAX_SHOWN]
        metrics = "<br>".join(f"{k} = {_fmt(v)} ({_fmt(cpu['metrics'].get(k, '-'))})" for k, v in shown)
        if len(gpu["metrics"]) > MAX_SHOWN:
            metrics += f"<br>[all {len(gpu['metrics'])}]({link}{path.name})"
        device = gpu["device"] + (f" ({gpu['device_name']})" if "device_name" in gpu else "")
        rows.append(f"| {gpu['notebook']} | {metrics} | {gpu['wall_time_s'] / 60:.1f} min "
                    f"({cpu['wall_time_s'] / 60:.1f} min) | {device} | {gpu['date']} |")
    return "\n".join(rows)


def with_run_times(text: str, results_dir: Path | None = None) -> str:
    """`text` (the README) with the "full run" column of its notebook table written from each
    notebook's record ("-" where it has none), in the format of the notebooks' run-time lines."""
    from course.notebook_meta import duration

    def row(m: re.Match) -> str:
        record = stored_record(m[2], results_dir)
        return m[1] + (duration(record["wall_time_s"]) if record else "-") + m[4]

    return NOTEBOOK_ROW.sub(row, text)


def readme_section(readme: Path = README) -> str:
    return marked_section(readme, START, END)


def readme_gpu_section(page: Path = GPU_PAGE) -> str:
    return marked_section(page, GPU_START, GPU_END)


def update_readme(readme: Path = README, gpu_page: Path = GPU_PAGE) -> None:
    """The README's results table and notebook run times, and the GPU table of `gpu_page`."""
    replace_marked_section(readme, START, END, render_table())
    readme.write_text(with_run_times(readme.read_text()))
    replace_marked_section(gpu_page, GPU_START, GPU_END, render_gpu_table())


# ---------------------------------------------------------------------------- reads of other runs
LOAD_CALL = re.compile(r"\bload_(?:results|metrics)\(")
NOTEBOOK_NAME = re.compile(r"[\"'](\d\d_[a-z0-9_]+)[\"']")


def _value_at(record: dict | None, path: str):
    """The value a recorded read names ("metrics.test_acc", "metrics.<keys>") in `record` now;
    None where it is absent, as the read itself notes an absent key."""
    if path == "<record>":
        return None if record is None else "present"
    *parents, leaf = path.split(".")
    node = record
    for part in parents:
        node = (node or {}).get(part)
    if not isinstance(node, dict):
        return None
    return sorted(node) if leaf == KEYS else node.get(leaf)


def _same(old, new) -> bool:
    if isinstance(old, float) and isinstance(new, float):
        return old == new or (math.isnan(old) and math.isnan(new))
    return old == new


def _upstream(source: str, results_dir: Path) -> dict | None:
    folder, _, name = source.rpartition("/")
    return stored_record(name, results_dir / folder if folder else results_dir)


def stale_reads(results_dir: Path = RESULTS_DIR) -> dict[str, list[str]]:
    """reader -> what it read that the upstream record no longer holds (empty: all current)."""
    stale = {}
    for path in sorted(results_dir.glob("[0-9][0-9]_*.json")):
        for source, values in json.loads(path.read_text()).get("reads", {}).items():
            now = _upstream(source, results_dir)
            changed = [f"{source} {key}: read {old!r}, now {_value_at(now, key)!r}"
                       for key, old in values.items() if not _same(old, _value_at(now, key))]
            if changed:
                stale.setdefault(path.stem, []).extend(changed)
    return stale


def notebook_reads(stem: str, notebooks: Path = NOTEBOOKS) -> set[str]:
    """The notebooks whose records `stem` reads, from its code cells: the names quoted in a
    cell that calls load_results or load_metrics (recorded reads may add more)."""
    nb = json.loads((notebooks / f"{stem}.ipynb").read_text(encoding="utf-8"))
    found = set()
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and LOAD_CALL.search(source):
            found |= set(NOTEBOOK_NAME.findall(source))
    return found - {stem}


def unrecorded_reads(results_dir: Path = RESULTS_DIR, notebooks: Path = NOTEBOOKS) -> list[str]:
    """Notebooks that read another record but whose own record notes no reads (a run from
    before reads were recorded): what they show cannot be traced to a current run."""
    return [p.stem for p in sorted(notebooks.glob("[0-9][0-9]_*.ipynb"))
            if notebook_reads(p.stem, notebooks)
            and "reads" not in (stored_record(p.stem, results_dir) or {"reads": {}})]


def dependencies(results_dir: Path = RESULTS_DIR, notebooks: Path = NOTEBOOKS) -> dict[str, set[str]]:
    """notebook -> the notebooks it reads (from its cells and its recorded reads)."""
    deps = {}
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        recorded = (stored_record(path.stem, results_dir) or {}).get("reads", {})
        deps[path.stem] = notebook_reads(path.stem, notebooks) | {
            s for s in recorded if "/" not in s} - {path.stem}
    return deps


def rerun_order(changed: list[str], results_dir: Path = RESULTS_DIR,
                notebooks: Path = NOTEBOOKS) -> list[str]:
    """`changed` and every notebook that reads one of them (directly or through others), each
    after everything it reads among them: the order in which to re-run them."""
    deps = dependencies(results_dir, notebooks)
    todo, frontier = set(changed), set(changed)
    while frontier:  # everything downstream
        frontier = {n for n, d in deps.items() if d & frontier} - todo
        todo |= frontier
    order = []
    while todo:  # a notebook is ready once nothing it reads is still to be run (a cycle: by number)
        ready = min((n for n in todo if not deps.get(n, set()) & (todo - {n})), default=min(todo))
        order.append(ready)
        todo.remove(ready)
    return order


def stale_report(results_dir: Path = RESULTS_DIR, notebooks: Path = NOTEBOOKS) -> str:
    """What is stale and what to re-run, in order ("" when every read is current)."""
    stale = stale_reads(results_dir)
    lines = [f"{reader}: " + "; ".join(items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")
             for reader, items in stale.items()]
    if stale:
        order = rerun_order(list(stale), results_dir, notebooks)
        lines.append("re-run with `python -m course run`, in this order: " + ", ".join(order))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course results",
        description="Rewrite the README's results table and notebook run times from "
                    "notebooks/results/*.json, and the GPU table of site/running.md from "
                    "notebooks/results/gpu/*.json; with --reads, check instead that every value "
                    "a notebook read from another notebook's record is still current.")
    parser.add_argument("--reads", action="store_true", help="only check the recorded reads")
    args = parser.parse_args(argv)
    if args.reads:
        report = stale_report()
        print(report or "every recorded read equals its upstream record")
        return 1 if report else 0
    update_readme()
    print(f"README results table, run times and GPU table rewritten from {len(list(RESULTS_DIR.glob('*.json')))} files "
          f"and {len(list(GPU_DIR.glob('*.json')))} GPU runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
