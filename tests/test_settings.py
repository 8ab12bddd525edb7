import pytest
import torch

# `setup` under another name: pytest 7 would call a module-level function named `setup` as a
# nose-style module fixture, with the module as its seed
from utils.settings import Run, get_device, is_fast, pick, run_header, seed_everything
from utils.settings import setup as course_setup


def test_pick_follows_seq_fast(monkeypatch):
    monkeypatch.setenv("SEQ_FAST", "1")
    assert is_fast() and pick(full=10, fast=1) == 1
    monkeypatch.setenv("SEQ_FAST", "0")
    assert not is_fast() and pick(full=10, fast=1) == 10


def test_bad_seq_fast_value_is_explained(monkeypatch):
    monkeypatch.setenv("SEQ_FAST", "yes please")
    with pytest.raises(ValueError, match="SEQ_FAST must be one of '1', 'true', 'yes', 'on', '0', 'false', 'no', 'off'"):
        is_fast()
    for value, fast in (("TRUE", True), (" On ", True), ("no", False), ("", False)):
        monkeypatch.setenv("SEQ_FAST", value)
        assert is_fast() is fast


@pytest.mark.parametrize("value", ["cuda", "cuda:3", "mps", "gpu", "cpu:x"])
def test_a_device_this_machine_lacks_is_refused_with_the_ones_it_has(monkeypatch, value):
    from utils.settings import available_devices

    if value in available_devices():
        pytest.skip(f"this machine has {value}")
    monkeypatch.setenv("SEQ_DEVICE", value)
    with pytest.raises(ValueError, match=rf"SEQ_DEVICE='{value}'.*this machine has .*cpu"):
        get_device()


def test_an_mps_index_beyond_the_one_mps_device_is_refused(monkeypatch):
    """A Mac has one MPS device: `mps:1` was accepted (CUDA indices were checked, MPS ones not)."""
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for ok in ("mps", "mps:0"):
        monkeypatch.setenv("SEQ_DEVICE", ok)
        assert get_device() == torch.device(ok)
    monkeypatch.setenv("SEQ_DEVICE", "mps:1")
    with pytest.raises(ValueError, match=r"SEQ_DEVICE='mps:1'.*no such device; it has mps, cpu"):
        get_device()


@pytest.mark.parametrize("value, meant", [("gpu", "cuda"), ("GPU:1", "cuda:1"), ("metal", "mps")])
def test_a_common_name_for_a_gpu_gets_torchs_name(monkeypatch, value, meant):
    monkeypatch.setenv("SEQ_DEVICE", value)
    with pytest.raises(ValueError, match=rf"is not a device name; for a GPU torch says '{meant}'"):
        get_device()


def test_seq_device_ignores_case_and_spaces(monkeypatch):
    monkeypatch.setenv("SEQ_DEVICE", " CPU ")
    assert get_device() == torch.device("cpu")


def test_the_header_says_which_precisions_the_device_offers():
    from utils.settings import precision_note, supported_precisions

    assert supported_precisions(torch.device("cpu")) == ["fp32", "bf16"]
    assert supported_precisions(torch.device("mps")) == ["fp32", "fp16"]  # no bfloat16 there
    assert "bfloat16 autocast available" in precision_note(torch.device("cpu"))
    assert "precision" in run_header(Run(seed=0, device=torch.device("cpu"), fast=True))


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
    run = course_setup(seed=7)
    out = capsys.readouterr().out
    assert isinstance(run, Run) and run.fast and run.seed == 7
    for word in ("mode", "fast", "device", "torch", torch.__version__, "seed", "7"):
        assert word in out
    assert run_header(run) in out


def test_setup_sets_cpu_threads():
    before = torch.get_num_threads()
    try:
        assert "(1 CPU thread)" in run_header(course_setup(seed=0, threads=1, quiet=True)) or (
            get_device().type != "cpu")
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="threads"):
            course_setup(threads=0, quiet=True)
    finally:
        torch.set_num_threads(before)


def test_check_settings_names_each_bad_setting_in_one_line(monkeypatch):
    """What the runner checks before it starts a kernel: `SEQ_DEVICE=cpux` once started one and
    failed in cell 2 after 14 traceback frames, `SEQ_FAST=2` gave a raw traceback."""
    from utils.settings import check_settings

    assert check_settings() == []
    monkeypatch.setenv("SEQ_FAST", "2")
    monkeypatch.setenv("SEQ_DEVICE", "cpux")
    problems = check_settings()
    assert len(problems) == 2 and all("\n" not in p for p in problems)
    assert problems[0].startswith("SEQ_FAST must be one of") and "'2'" in problems[0]
    assert problems[1].startswith("SEQ_DEVICE='cpux' is not a device name")
