import json
import math
import re
import shutil

import pytest
import torch

from course import results as tables
from course.numbers import agrees, parse_number
from utils import results
from utils.settings import Run
from utils.show import SHOW_CALL


def _run(fast: bool) -> Run:
    return Run(seed=0, device=torch.device("cpu"), fast=fast)


def test_full_run_writes_json(tmp_path):
    path = results.save_results(_run(False), "99_demo", {"ppl": torch.tensor(3.5), "n": 2},
                                sizes={"train": 10}, results_dir=tmp_path)
    record = json.loads(path.read_text())
    assert record["metrics"] == {"ppl": 3.5, "n": 2} and record["dataset_sizes"] == {"train": 10}
    for key in ("date", "device", "torch", "wall_time_s", "mode"):
        assert key in record
    assert results.load_metrics("99_demo", results_dir=tmp_path) == {"ppl": 3.5, "n": 2}
    assert results.load_metrics("98_missing", results_dir=tmp_path) is None
    assert results.load_results("99_demo", results_dir=tmp_path)["dataset_sizes"] == {"train": 10}
    assert results.load_results("98_missing", results_dir=tmp_path) is None


def test_a_results_folder_given_as_a_string_is_read_as_it_is_written(tmp_path):
    """save_results took a str folder; load_results and load_metrics raised TypeError on it."""
    folder = str(tmp_path)
    results.save_results(_run(False), "99_demo", {"x": 1}, results_dir=folder)
    assert results.load_metrics("99_demo", results_dir=folder) == {"x": 1}
    assert results.load_results("99_demo", results_dir=folder)["metrics"] == {"x": 1}
    assert results.load_metrics("98_missing", results_dir=folder) is None


def test_metrics_become_plain_numbers_in_place(tmp_path):
    """A notebook displays its metrics after saving them: it must show 0.8473, not
    np.float64(0.8473) (notebooks 05 and 06 once did)."""
    import numpy as np
    metrics = {"acc": np.float64(0.8473), "n": np.int64(3), "loss": torch.tensor(1.5), "name": "x"}
    results.save_results(_run(True), "99_demo", metrics, results_dir=tmp_path)
    assert metrics == {"acc": 0.8473, "n": 3, "loss": 1.5, "name": "x"}
    assert [type(v) for v in metrics.values()] == [float, int, float, str]
    assert "np." not in repr(metrics)


def test_committed_outputs_show_no_numpy_scalar_reprs():
    """What a student reads: no `np.float64(...)` in any committed output."""
    for path in sorted((results.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
                assert not re.search(r"np\.(float|int)\d+\(", text), f"{path.name} cell {i} shows {text[:80]!r}"


def test_fast_run_records_nothing(tmp_path, capsys):
    assert results.save_results(_run(True), "99_demo", {"x": 1}, results_dir=tmp_path) is None
    assert list(tmp_path.iterdir()) == [] and "not recorded" in capsys.readouterr().out


def test_notebook_name_is_checked(tmp_path):
    with pytest.raises(ValueError, match="01_text_preprocessing"):
        results.save_results(_run(False), "text prep", {}, results_dir=tmp_path)


def test_readme_results_table_matches_the_result_files():
    assert tables.readme_section() == tables.render_table(), (
        "README results table is stale: run `python -m course results`"
    )


def test_readme_gpu_table_matches_the_gpu_result_files():
    """The GPU table lives on the page "Running the course" (site/running.md) since issue 66."""
    assert tables.readme_gpu_section() == tables.render_gpu_table(), (
        "the GPU table of site/running.md is stale: run `python -m course results`"
    )


def test_the_readme_notebook_table_gives_each_notebooks_recorded_run_time(tmp_path):
    """A newcomer reads the run times in the notebook table; they come from the records."""
    readme = tables.README.read_text()
    rows = tables.NOTEBOOK_ROW.findall(readme)
    assert len(rows) == len(list(tables.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))) > 0
    assert tables.with_run_times(readme) == readme, "run `python -m course results`"
    fake = "| 99 | [Demo](notebooks/99_demo.ipynb) | things | - | toy |"
    assert tables.with_run_times(fake) == fake  # no record: a dash
    (tmp_path / "01_text_preprocessing.json").write_text(json.dumps({"wall_time_s": 32.4}))
    row = "| 01 | [Text](notebooks/01_text_preprocessing.ipynb) | tokens | 3 min | IMDB |"
    assert tables.with_run_times(row, tmp_path) == row.replace("3 min", "32 s")


def test_gpu_records_are_full_gpu_runs_under_the_cpu_runs_keys():
    """notebooks/results/gpu/ holds full runs made on a GPU, copied unchanged: same keys as the
    committed CPU run, except those that name a learning rate chosen by the run itself."""
    for path in sorted(results.GPU_DIR.glob("*.json")):
        gpu, cpu = json.loads(path.read_text()), results.load_results(path.stem)
        assert cpu is not None, f"gpu/{path.name} has no committed CPU run beside it"
        assert gpu["mode"] == "full" and gpu["device"].startswith("cuda"), path.name
        fixed = {k for k in cpu["metrics"] if not re.search(r"_lr\d", k)}
        assert fixed <= set(gpu["metrics"]), f"gpu/{path.name} lacks {sorted(fixed - set(gpu['metrics']))}"


def test_gpu_table_sets_each_gpu_run_beside_its_cpu_run(tmp_path):
    cpu_dir, gpu_dir = tmp_path / "cpu", tmp_path / "gpu"
    cpu_dir.mkdir(), gpu_dir.mkdir()
    record = {"notebook": "99_demo", "date": "2026-11-27", "mode": "full", "device": "cuda",
              "device_name": "NVIDIA H200", "wall_time_s": 60.0, "metrics": {"bleu": 35.47, "new": 1}}
    (gpu_dir / "99_demo.json").write_text(json.dumps(record))
    (cpu_dir / "99_demo.json").write_text(json.dumps({**record, "device": "cpu", "wall_time_s": 1620.0,
                                                       "metrics": {"bleu": 35.56}}))
    row = tables.render_gpu_table(gpu_dir, cpu_dir).splitlines()[-1]
    assert row == ("| 99_demo | bleu = 35.47 (35.56)<br>new = 1 (-) | 1.0 min (27.0 min) | cuda (NVIDIA H200) "
                   "| 2026-11-27 |")


def test_a_cuda_run_records_which_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    run = Run(seed=0, device=torch.device("cuda:0"), fast=False)
    record = json.loads(results.save_results(run, "99_demo", {"x": 1}, results_dir=tmp_path).read_text())
    assert (record["device"], record["device_name"]) == ("cuda:0", "NVIDIA H200")
    cpu = json.loads(results.save_results(_run(False), "99_demo", {"x": 1}, results_dir=tmp_path).read_text())
    assert "device_name" not in cpu


def test_every_results_file_belongs_to_a_notebook():
    notebooks = {p.stem for p in results.RESULTS_DIR.parent.glob("*.ipynb")}
    for path in results.RESULTS_DIR.glob("*.json"):
        assert path.stem in notebooks, f"{path.name} has no notebook"


def test_every_committed_full_run_keeps_its_time_budget():
    """The design budget on a 2-core CPU: 15 minutes for notebooks 01-05, 30 for 06-14.
    A committed run over it means students wait longer than the course promises (11 once took 48)."""
    for path in sorted(results.RESULTS_DIR.glob("*.json")):
        record = results.load_results(path.stem)
        if record.get("mode") != "full" or record.get("device") != "cpu":
            continue
        budget = 15 if int(path.stem[:2]) <= 5 else 30
        minutes = record["wall_time_s"] / 60
        assert minutes <= budget, f"{path.stem}: {minutes:.1f} min, over its {budget}-minute budget"


# ---------------------------------------------------------------------------- results vs outputs
# A number as printed: optional sign, digits (thousands commas allowed), decimals, exponent, %.
NUMBER = (r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?%?"
          r"|[-+]?\.\d+(?:[eE][-+]?\d+)?%?")
PRINTED = re.compile(rf"(?<![\w.])(?:{NUMBER})")

# Result keys whose value no output before the record is built prints, in the committed run
# (derived by arithmetic in the cell that builds the record). The next full run of the notebook
# prints them; then the entry must go (the test fails on an entry that is printed or no longer
# recorded).
NOT_PRINTED: dict[str, set[str]] = {
    "14_taming_the_transformer": {"runs_trained"},  # printed in the record cell itself; the next run prints it before
    "07_seq2seq_and_attention": {"attention_entropy_share_luong"},
    "11_gpt_language_models": {"gpt_char_val_loss_window100"},  # printed in bits
    # printed with one significant digit ("0.007" for 0.0074), which traces nothing; each
    # notebook's re-run under its open issue of this round prints them in full
    "09_transformer_classifier": {"ladder_gain_std_pre_ln", "val_test_gap_tfidf_lr", "val_test_gap_seed_config"},
}
# The cell that builds a notebook's record: it assigns or updates `metrics`, or saves it.
RECORD_CELL = re.compile(r"^metrics\b\s*(?:=|\|=|\[|\.update)|save_results\(", re.M)


def _cell_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream" and out["name"] == "stdout":
            parts.append("".join(out["text"]))
        elif "text/plain" in out.get("data", {}):
            parts.append("".join(out["data"]["text/plain"]))
    return "\n".join(parts)


def output_text(notebook: dict, before_record: bool = False) -> str:
    """Everything a notebook's stored outputs print (stdout and text results), code listings
    of `show_source` cells excluded; with `before_record`, only the cells above the one that
    builds the results record (so the record's own display does not count)."""
    parts = []
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or SHOW_CALL.fullmatch(source.strip()):
            continue
        if before_record and RECORD_CELL.search(source):
            break
        parts.append(_cell_text(cell))
    return "\n".join(parts)


def printed_as(key: str, value: float, text: str) -> str | None:
    """None if `text` prints `value` for `key`, else what is wrong.

    Where the outputs name the key (key = 1.234, or a printed dict's 'key': 1.234), every such
    number must agree with the value at its printed precision. Elsewhere some number printed
    with at least 2 significant digits must agree, or equal the value exactly (an integer, a
    rate of 0.03): "0.07" for 0.0726 traces nothing.
    """
    named = re.findall(rf"(?<![\w.])['\"]?{re.escape(key)}['\"]?\s*[:=]\s*({NUMBER})", text)
    if named:
        wrong = [t for t in named if not agrees(value, t)]
        return f"printed as {wrong}" if wrong else None
    for token in PRINTED.findall(text):
        exact = abs(value - parse_number(token)[0]) <= 1e-12 * abs(value)  # a rate of 0.03 is 0.03
        if agrees(value, token) and (parse_number(token)[2] >= 2 or isinstance(value, int) or exact):
            return None
    return "not printed"


def display_tolerance(value: float) -> float:
    """How far a displayed number may be from the recorded one. Notebooks display their metrics
    dict as Python's repr of each number, exact or rounded to 3 or 4 decimals or 4 significant
    digits, whichever keeps more; so "1.0" there means 1.0 +- 0.0005, not +- 0.05 (repr drops
    the trailing zeros that printing with a format keeps)."""
    if isinstance(value, int):  # counts are displayed whole (81440 or 81440.0)
        return 0.0
    fourth_digit = 10.0 ** (math.floor(math.log10(abs(value))) - 3) if value else 0.0
    return max(5e-4, 0.5 * fourth_digit) * (1 + 1e-9)


def shown_in_the_record_display(key: str, value: float, text: str) -> str | None:
    """None if the notebook's display of its metrics dict shows `'key': value`, else what is
    wrong: what the run displayed is what the file must hold."""
    shown = re.findall(rf"(?<![\w.])['\"]{re.escape(key)}['\"]\s*:\s*({NUMBER})", text)
    if not shown:
        return "not in the displayed metrics"
    wrong = [t for t in shown if abs(value - float(t.replace(",", ""))) > display_tolerance(value)]
    return f"displayed as {wrong}" if wrong else None


def test_parse_and_agree_at_the_printed_precision():
    assert parse_number("63,082,496") == (63082496.0, 0.5, 8)
    assert [parse_number(t)[2] for t in ("0.07", "0.0726", "0.24", "0.00", "3", "1.0")] == [1, 3, 2, 2, 1, 2]
    assert printed_as("chance", 0.0726, "chance weight 0.07") == "not printed"  # 1 digit traces nothing
    assert agrees(35.616905, "35.62") and not agrees(35.626, "35.62")
    assert agrees(3.9e-6, "0.0004%") and agrees(1.23e-7, "1.2e-07") and agrees(-0.00012, "-0.0001")
    assert printed_as("bleu", 35.6169, "{'bleu': 35.617, 'bleu_lc': 37.0}") is None
    assert printed_as("bleu", 36.6169, "{'bleu': 35.617}") == "printed as ['35.617']"
    assert printed_as("bleu", 36.6169, "{'bleu_lc': 35.617}") == "not printed"
    assert printed_as("share", 0.0, "carry   0.00% of the gradient") is None
    assert printed_as("acc", 0.616, "per seed: 1.00 0.24 0.61; 3 of 3") == "not printed"
    assert printed_as("ppl", 5.0083, "rnn   528  5.01  17.9") is None
    assert shown_in_the_record_display("bleu", 35.6169, "{'bleu': 35.617}") is None
    assert shown_in_the_record_display("bleu", 35.6169, "bleu = 35.617") == "not in the displayed metrics"
    assert shown_in_the_record_display("bleu", 35.7, "{'bleu': 35.617}") == "displayed as ['35.617']"
    assert shown_in_the_record_display("acc", 1.011, "{'acc': 1.0}") == "displayed as ['1.0']"


def _record_and_notebook(path):
    metrics = json.loads(path.read_text(encoding="utf-8"))["metrics"]
    notebook = json.loads((results.RESULTS_DIR.parent / f"{path.stem}.ipynb").read_text(encoding="utf-8"))
    numbers = {k: v for k, v in metrics.items()  # non-finite values are stored as strings
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return numbers, notebook


RESULT_FILES = sorted(results.RESULTS_DIR.glob("[0-9][0-9]_*.json"))


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_every_recorded_value_is_printed_before_the_record_is_built(path):
    """Each number in a results file can be traced to an output a reader sees *before* the
    cell that builds the record (the record's own display would vouch for anything): notebook
    06 once recorded F1 means over seeds while printing only seed 0's F1."""
    numbers, notebook = _record_and_notebook(path)
    text = output_text(notebook, before_record=True)
    allowed = NOT_PRINTED.get(path.stem, set())
    problems = {}
    for key, value in numbers.items():
        problem = printed_as(key, value, text)
        if problem and key not in allowed:
            problems[key] = f"{value!r} {problem}"
        elif not problem and key in allowed:
            problems[key] = "is printed now: remove it from NOT_PRINTED"
    problems.update({k: "is in NOT_PRINTED but not recorded" for k in allowed - set(numbers)})
    assert not problems, f"{path.name} vs the outputs of {path.stem}.ipynb: {problems}"


FINGERPRINT = re.compile(r"recorded \d+ metrics to results/(?:local/)?(\d\d_\w+)\.json \(fingerprint ([0-9a-f]{12})\)")


def printed_fingerprint(stem: str, text: str) -> str | None:
    """The fingerprint `save_results` printed for `stem`'s record, if this run printed one."""
    return next((fp for name, fp in FINGERPRINT.findall(text) if name == stem), None)


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_every_recorded_value_is_what_the_run_displayed(path):
    """A value edited by hand in a results file fails here, on its own. A run made with today's
    `save_results` printed the fingerprint of what it recorded, and does not display its whole
    metrics dict (13 once printed 75 keys, 14 printed 152); an older run displayed the dict,
    and the file must agree with that display."""
    numbers, notebook = _record_and_notebook(path)
    text = output_text(notebook)
    printed = printed_fingerprint(path.stem, text)
    if printed:
        stored = json.loads(path.read_text(encoding="utf-8"))["metrics"]
        assert results.fingerprint(stored) == printed, f"{path.name} differs from what its run recorded"
        shown = [k for k in numbers if shown_in_the_record_display(k, numbers[k], text) is None]
        assert len(shown) < max(5, len(numbers) // 2), f"{path.stem} displays its whole metrics dict"
        return
    problems = {k: f"{v!r} {p}" for k, v in numbers.items() if (p := shown_in_the_record_display(k, v, text))}
    assert not problems, f"{path.name} vs the displayed metrics of {path.stem}.ipynb: {problems}"


def test_a_value_edited_by_hand_is_caught_by_the_results_test_alone():
    """Every recorded number of every notebook, edited by hand (up by 1% + 0.001, or down by
    1), is caught by the fingerprint or the display check; the README is not consulted."""
    for path in RESULT_FILES:
        numbers, notebook = _record_and_notebook(path)
        text = output_text(notebook)
        stored = json.loads(path.read_text(encoding="utf-8"))["metrics"]
        printed = printed_fingerprint(path.stem, text)
        for key, value in numbers.items():
            for edited in (value * 1.01 + (1 if isinstance(value, int) else 1e-3), value - 1):
                if printed:
                    assert results.fingerprint({**stored, key: edited}) != printed
                else:
                    assert shown_in_the_record_display(key, edited, text), f"{path.stem}: {key} edited to {edited}"


def test_save_results_prints_the_fingerprint_of_what_it_wrote(tmp_path, capsys):
    path = results.save_results(_run(False), "99_demo", {"acc": 0.9052, "loss": float("nan")},
                                results_dir=tmp_path)
    stored = json.loads(path.read_text())["metrics"]
    assert printed_fingerprint("99_demo", capsys.readouterr().out) == results.fingerprint(stored)


def _tracked_copy(tmp_path, monkeypatch):
    """A copy of the tracked results as RESULTS_DIR, and an empty LOCAL_DIR beside it."""
    tracked = tmp_path / "results"
    shutil.copytree(results.RESULTS_DIR, tracked, ignore=shutil.ignore_patterns("local"))
    monkeypatch.setattr(results, "RESULTS_DIR", tracked)
    monkeypatch.setattr(results, "LOCAL_DIR", tracked / "local")
    return tracked


def test_a_students_full_run_leaves_the_tracked_results_untouched(tmp_path, monkeypatch, capsys):
    """A notebook's `save_results` call in JupyterLab or Colab, i.e. outside the runner."""
    monkeypatch.delenv(results.RECORD_ENV, raising=False)
    tracked = _tracked_copy(tmp_path, monkeypatch)
    before = {p.name: p.read_bytes() for p in tracked.glob("*.json")}
    path = results.save_results(_run(False), "03_recurrent_neural_networks", {"val_loss": 9.9})
    assert {p.name: p.read_bytes() for p in tracked.glob("*.json")} == before
    assert path == tracked / "local" / "03_recurrent_neural_networks.json"
    assert json.loads(path.read_text())["metrics"] == {"val_loss": 9.9}
    assert "python -m course run" in capsys.readouterr().out
    assert tables.render_table(tracked) == tables.readme_section(), "README test still passes"


def test_the_runner_records_into_the_tracked_results(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RECORD_ENV, "1")  # what `python -m course run` sets
    tracked = _tracked_copy(tmp_path, monkeypatch)
    path = results.save_results(_run(False), "03_recurrent_neural_networks", {"val_loss": 9.9})
    assert path == tracked / "03_recurrent_neural_networks.json"
    assert json.loads(path.read_text())["metrics"] == {"val_loss": 9.9}


def test_student_results_are_git_ignored():
    ignored = (results.REPO_ROOT / ".gitignore").read_text().splitlines()
    assert f"{results.LOCAL_DIR.relative_to(results.REPO_ROOT)}/" in ignored


def test_marked_sections_are_read_and_replaced_between_their_markers(tmp_path):
    """The README tables (results, data files) are rewritten between their markers only."""
    from utils.settings import marked_section, replace_marked_section
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- a -->\nold\n<!-- b -->\nafter\n")
    assert marked_section(readme, "<!-- a -->", "<!-- b -->") == "old"
    replace_marked_section(readme, "<!-- a -->", "<!-- b -->", "new | table")
    assert readme.read_text() == "intro\n<!-- a -->\nnew | table\n<!-- b -->\nafter\n"
    readme.write_text("no markers here\n")
    with pytest.raises(ValueError, match="lacks the markers"):
        replace_marked_section(readme, "<!-- a -->", "<!-- b -->", "x")
    assert readme.read_text() == "no markers here\n"

