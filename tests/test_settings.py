import pytest
import torch

from utils.settings import Run, get_device, is_fast, pick, run_header, seed_everything, setup


def test_pick_follows_seq_fast(monkeypatch):
    monkeypatch.setenv("SEQ_FAST", "1")
    assert is_fast() and pick(full=10, fast=1) == 1
    monkeypatch.setenv("SEQ_FAST", "0")
    assert not is_fast() and pick(full=10, fast=1) == 10


def test_bad_seq_fast_value_is_explained(monkeypatch):
    monkeypatch.setenv("SEQ_FAST", "yes please")
    with pytest.raises(ValueError, match="SEQ_FAST must be 0 or 1"):
        is_fast()


def test_seeding_repeats_random_draws():
    seed_everything(3)
    a = torch.randn(4)
    seed_everything(3)
    assert torch.equal(a, torch.randn(4))


def test_device_override(monkeypatch):
    """SEQ_DEVICE wins over detection: "meta" is never auto-detected, so only the override gives it."""
    monkeypatch.setenv("SEQ_DEVICE", "meta")
    assert get_device() == torch.device("meta")
    monkeypatch.delenv("SEQ_DEVICE")
    assert get_device() != torch.device("meta")


def test_setup_prints_the_run_header(capsys, monkeypatch):
    monkeypatch.setenv("SEQ_FAST", "1")
    run = setup(seed=7)
    out = capsys.readouterr().out
    assert isinstance(run, Run) and run.fast and run.seed == 7
    for word in ("mode", "fast", "device", "torch", torch.__version__, "seed", "7"):
        assert word in out
    assert run_header(run) in out


def test_setup_sets_cpu_threads():
    before = torch.get_num_threads()
    try:
        assert "(1 CPU threads)" in run_header(setup(seed=0, threads=1, quiet=True)) or (
            get_device().type != "cpu")
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="threads"):
            setup(threads=0, quiet=True)
    finally:
        torch.set_num_threads(before)
