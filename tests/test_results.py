import json
import shutil

import pytest
import torch

from utils import results
from utils.settings import Run


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


def test_fast_run_records_nothing(tmp_path, capsys):
    assert results.save_results(_run(True), "99_demo", {"x": 1}, results_dir=tmp_path) is None
    assert list(tmp_path.iterdir()) == [] and "not recorded" in capsys.readouterr().out


def test_notebook_name_is_checked(tmp_path):
    with pytest.raises(ValueError, match="01_text_preprocessing"):
        results.save_results(_run(False), "text prep", {}, results_dir=tmp_path)


def test_readme_results_table_matches_the_result_files():
    assert results.readme_section() == results.render_table(), (
        "README results table is stale: run `python -m utils.results`"
    )


def test_every_results_file_belongs_to_a_notebook():
    notebooks = {p.stem for p in results.RESULTS_DIR.parent.glob("*.ipynb")}
    for path in results.RESULTS_DIR.glob("*.json"):
        assert path.stem in notebooks, f"{path.name} has no notebook"


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
    assert "python -m utils.course run" in capsys.readouterr().out
    assert results.render_table(tracked) == results.readme_section(), "README test still passes"


def test_the_runner_records_into_the_tracked_results(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RECORD_ENV, "1")  # what `python -m utils.course run` sets
    tracked = _tracked_copy(tmp_path, monkeypatch)
    path = results.save_results(_run(False), "03_recurrent_neural_networks", {"val_loss": 9.9})
    assert path == tracked / "03_recurrent_neural_networks.json"
    assert json.loads(path.read_text())["metrics"] == {"val_loss": 9.9}


def test_student_results_are_git_ignored():
    ignored = (results.REPO_ROOT / ".gitignore").read_text().splitlines()
    assert f"{results.LOCAL_DIR.relative_to(results.REPO_ROOT)}/" in ignored
