"""Numbers that stay true: every value a notebook shows traces to a current run.

1. Reads: a notebook that reads another notebook's record (`utils.results.load_results` /
   `load_metrics`) writes what it read into its own record, and every value it read still
   equals the upstream record; otherwise the test names the notebooks to re-run, in order.
2. Prose: every decimal number (and integer with a unit) in a notebook's markdown appears in
   that notebook's outputs, code or results file (`course.numbers`), or is a literature
   number listed with its source in `tests/quoted_numbers.json`.
3. The ratchet: `tests/pending_reruns.txt` lists the notebooks that fail a check today and the
   open issue whose full re-run fixes each; a listed check that passes must be removed.
"""

import json
from pathlib import Path

import pytest

from course import numbers
from course.results import notebook_reads, rerun_order, stale_reads, stale_report, unrecorded_reads
from utils import results
from utils.settings import Run

TESTS = Path(__file__).parent
NOTEBOOKS = TESTS.parent / "notebooks"
STEMS = [p.stem for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]
QUOTED = json.loads((TESTS / "quoted_numbers.json").read_text())
CHECKS = {"reads", "prose"}


def pending() -> dict[str, set[str]]:
    """notebook -> the checks it is allowed to fail until its re-run (tests/pending_reruns.txt)."""
    listed = {}
    for line in (TESTS / "pending_reruns.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            stem, checks, issue = (part.strip() for part in line.split("|"))
            listed[stem] = set(checks.split())
            assert stem in STEMS and listed[stem] <= CHECKS and issue, f"bad line: {line!r}"
    return listed


def _ratchet(stem: str, check: str, problems: list[str]) -> None:
    if check in pending().get(stem, set()):
        assert problems, (f"{stem} passes the {check!r} check now: remove it from its line in "
                          "tests/pending_reruns.txt")
    else:
        assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stem", STEMS)
def test_what_a_notebook_read_from_another_is_recorded_and_current(stem):
    problems = [f"{stem} reads {', '.join(sorted(notebook_reads(stem)))} but its record notes no reads "
                "(a run from before reads were recorded): re-run it"] if stem in unrecorded_reads() else []
    stale = stale_reads().get(stem, [])
    if stale:
        problems.append(f"{stem} shows values its upstream records no longer hold:\n" + stale_report())
    _ratchet(stem, "reads", problems)


@pytest.mark.parametrize("stem", STEMS)
def test_every_number_in_the_prose_traces_to_the_notebooks_own_run(stem):
    problems = [f"{stem} cell {i}: {token!r} appears in no output, code or result of this notebook "
                f"(…{context}…); print it, or list a literature number in tests/quoted_numbers.json"
                for i, token, context in numbers.untraced(stem, QUOTED.get(stem))]
    _ratchet(stem, "prose", problems)


def test_every_listed_literature_number_is_quoted_in_its_notebook():
    for stem, quoted in QUOTED.items():
        notebook = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text(encoding="utf-8"))
        stated = {token.lstrip("+-−") for _, token, _ in numbers.stated_numbers(notebook)}
        assert set(quoted) <= stated, f"{stem}: {set(quoted) - stated} no longer quoted: remove them"


def test_the_pending_list_names_only_notebooks_and_checks():
    assert set(pending()) <= set(STEMS)


# ---------------------------------------------------------------------------- the mechanism
def _notebook(tmp: Path, stem: str, code: str) -> None:
    cells = [{"cell_type": "code", "source": code, "outputs": [], "metadata": {}}]
    (tmp / f"{stem}.ipynb").write_text(json.dumps({"cells": cells}))


def _record(folder: Path, stem: str, metrics: dict) -> None:
    run = Run(seed=0, device="cpu", fast=False)
    results.save_results(run, stem, metrics, results_dir=folder)


@pytest.fixture
def fresh_reads(monkeypatch):
    monkeypatch.setattr(results, "_READS", {})


def test_reads_are_noted_and_written_with_the_readers_record(tmp_path, fresh_reads, capsys):
    _record(tmp_path, "02_up", {"ppl": 4.557, "order": 7, "unused": 1.0})
    up = results.load_metrics("02_up", tmp_path)
    assert up["ppl"] == 4.557 and up.get("absent") is None and "order" in up
    assert results.load_results("05_missing", tmp_path) is None
    _record(tmp_path, "03_down", {"rnn_ppl": 4.9})
    reads = json.loads((tmp_path / "03_down.json").read_text())["reads"]
    source = next(s for s in reads if s.endswith("02_up"))
    assert reads[source] == {"metrics.ppl": 4.557, "metrics.absent": None, "metrics.order": 7}  # "unused" was never read
    assert "values read from" in capsys.readouterr().out


def test_a_loop_over_the_metrics_notes_every_key_and_value(tmp_path, fresh_reads):
    _record(tmp_path, "06_up", {"acc_a": 0.9, "acc_b": 0.8})
    shown = {k: v for k, v in results.load_metrics("06_up", tmp_path).items()}
    assert shown == {"acc_a": 0.9, "acc_b": 0.8}
    (noted,) = results.reads().values()
    assert noted == {f"metrics.{results.KEYS}": ["acc_a", "acc_b"], "metrics.acc_a": 0.9, "metrics.acc_b": 0.8}


def test_a_changed_upstream_value_makes_the_reader_stale_and_names_the_order(tmp_path, fresh_reads,
                                                                            monkeypatch):
    """02 -> 03 -> 05 (05 reads both): after 02 changes, 03 is stale, and the order to re-run
    is 03 then 05, though 05 read nothing that changed yet."""
    notebooks = tmp_path / "nb"
    folder = notebooks / "results"
    folder.mkdir(parents=True)
    monkeypatch.setattr(results, "RESULTS_DIR", folder)  # reads are named relative to it
    _notebook(notebooks, "02_up", "")
    _notebook(notebooks, "03_mid", 'load_metrics("02_up")')
    _notebook(notebooks, "05_down", 'for n in ("02_up", "03_mid"):\n    load_metrics(n)')
    _record(folder, "02_up", {"ppl": 4.986})
    results.load_metrics("02_up")["ppl"]  # noqa: B018 (03 reads 02's bar)
    _record(folder, "03_mid", {"rnn": 4.9})
    results._READS.clear()
    results.load_metrics("03_mid")["rnn"]  # noqa: B018
    _record(folder, "05_down", {"gru": 4.8})
    assert stale_reads(folder) == {}
    results._READS.clear()  # 02 reads nothing
    _record(folder, "02_up", {"ppl": 4.557})  # 02 re-run with a new bar
    assert stale_reads(folder) == {"03_mid": ["02_up metrics.ppl: read 4.986, now 4.557"]}
    assert rerun_order(["02_up"], folder, notebooks) == ["02_up", "03_mid", "05_down"]
    assert "in this order: 03_mid, 05_down" in stale_report(folder, notebooks)


def test_a_key_read_as_missing_is_stale_once_upstream_has_it(tmp_path, fresh_reads, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    _record(tmp_path, "06_up", {"acc": 0.9})
    results.load_metrics("06_up").get("test_acc_best_gru")
    _record(tmp_path, "09_down", {"acc": 0.85})
    _record(tmp_path, "06_up", {"acc": 0.9, "test_acc_best_gru": 0.886})
    assert stale_reads(tmp_path) == {"09_down": ["06_up metrics.test_acc_best_gru: read None, now 0.886"]}


def test_a_notebook_that_reads_without_recording_is_found(tmp_path):
    (tmp_path / "results").mkdir()
    _notebook(tmp_path, "06_up", "")
    _notebook(tmp_path, "09_down", 'r06 = load_results("06_up")')
    (tmp_path / "results" / "09_down.json").write_text(json.dumps({"metrics": {}}))
    assert unrecorded_reads(tmp_path / "results", tmp_path) == ["09_down"]


def test_the_runner_says_which_notebooks_read_the_one_it_ran(monkeypatch, capsys):
    from course import notebooks as runner

    monkeypatch.setattr(runner, "run", lambda path: 1.0)
    monkeypatch.setenv("SEQ_FAST", "0")
    assert runner.run_command(["02"], all_confirmed=False) == 0
    out = capsys.readouterr().out
    assert "re-run them in this order: 03_recurrent_neural_networks, 05_lstm_and_gru, 11_gpt" in out


# ---------------------------------------------------------------------------- prose numbers
def _markdown(text: str, tags=()) -> dict:
    return {"cell_type": "markdown", "source": text, "metadata": {"tags": list(tags)}}


def test_prose_numbers_are_found_outside_math_code_references_and_solutions():
    nb = {"cells": [
        _markdown("The GRU ends 0.061 nats below; $p = 0.5$ and `lr=0.25`, eqs. 7.23-7.27, "
                  "§5.13–5.14, Python 3.11, [link](https://x.org/a/1.5), 2,000 updates in 213 s."),
        _markdown("Exercise: 0.333", tags=["solution"]),
        _markdown("**Run time:** 14.4 min on a CPU"),
    ]}
    assert [t for _, t, _ in numbers.stated_numbers(nb)] == ["0.061", "2,000", "213"]


@pytest.mark.parametrize("token, shown, ok", [
    ("0.908", [0.90817], True), ("0.908", [0.9086], False),  # rounded as written
    ("8.1", [0.081], True), ("8.1%", [0.0812], True),  # a share stated in points or percent
    ("14.4", [862.0], True),  # minutes of a wall time in seconds
    ("-0.061", [0.0612], True), ("+0.075", [-0.075], True),  # a gap stated without its sign
    ("10.7M", [10_745_000.0], True), ("3.6e-07", [3.6e-7], True), ("2,000", [2000.0], True),
    ("0.875", [0.87, 0.904], False),  # read off a plot
])
def test_a_stated_number_traces_at_its_printed_precision(token, shown, ok):
    assert numbers.traces(token, shown) is ok


def test_outputs_code_and_the_results_file_all_count(tmp_path):
    (tmp_path / "results").mkdir()
    cells = [_markdown("We read 2.8M characters at rate 0.25, val 4.557, in 12.5 s."),
             {"cell_type": "code", "source": "lr = 0.25", "metadata": {},
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "read 2,812,000 chars\n"}]}]
    (tmp_path / "01_x.ipynb").write_text(json.dumps({"cells": cells}))
    (tmp_path / "results" / "01_x.json").write_text(json.dumps({"metrics": {"ppl": 4.5571}}))
    assert [t for _, t, _ in numbers.untraced("01_x", notebooks=tmp_path)] == ["12.5"]
    assert numbers.untraced("01_x", {"12.5": "a paper"}, notebooks=tmp_path) == []
