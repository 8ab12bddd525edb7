import json

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
