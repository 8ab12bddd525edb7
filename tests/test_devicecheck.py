"""The GPU stand-in: on `cpu:0` with the check on, what would fail on a GPU fails here."""

import pytest
import torch
from torch import nn

from course import devicecheck
from course.devicecheck import DevicePlacementError

DEV = torch.device("cpu:0")


@pytest.fixture
def check():
    devicecheck.install(DEV)
    yield
    devicecheck.remove()


def test_a_model_never_sent_to_the_device_is_refused(check):
    x = torch.randn(2, 3, device=DEV)
    with pytest.raises(DevicePlacementError, match=r"Linear runs with its weight .*model.to\(run.device\)"):
        nn.Linear(3, 2)(x)
    with pytest.raises(DevicePlacementError, match="Linear runs with its weight"):
        nn.Linear(3, 2)(torch.randn(2, 3))  # both on the CPU: still not where run.device is


def test_a_cpu_tensor_next_to_a_device_tensor_is_refused(check):
    model = nn.Linear(3, 2).to(DEV)
    with pytest.raises(DevicePlacementError, match="mixes a tensor on run.device"):
        model(torch.randn(2, 3))
    y = model(torch.randn(2, 3).to(DEV))
    with pytest.raises(DevicePlacementError, match="mixes"):
        nn.functional.cross_entropy(y, torch.tensor([0, 1]))  # targets left on the CPU
    nn.functional.cross_entropy(y, torch.tensor([0, 1], device=y.device))  # device=x.device follows
    assert (y * torch.tensor(2.0)).shape == (2, 2)  # a CPU scalar is fine, as on a GPU


def test_numpy_needs_cpu_first_and_cpu_gives_a_copy(check):
    x = torch.ones(3).to(DEV)
    with pytest.raises(DevicePlacementError, match=r"`numpy`.*x.cpu\(\)"):
        x.numpy()
    host = x.cpu()
    assert host.numpy().sum() == 3 and devicecheck.on_device(x) and not devicecheck.on_device(host)
    assert x.sum().item() == 3.0  # numbers come back with .item()


def test_backward_through_an_rnn_in_eval_mode_is_refused(check):
    rnn = nn.LSTM(3, 4, batch_first=True).to(DEV).eval()
    out, _ = rnn(torch.randn(2, 5, 3, device=DEV))
    with pytest.raises(DevicePlacementError, match="cuDNN refuses it"):
        out.sum().backward()
    rnn.train()
    rnn(torch.randn(2, 5, 3, device=DEV))[0].sum().backward()  # train mode: allowed


def test_correct_code_passes_and_trains_through_fit(check):
    from utils.train import fit

    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).to(DEV)
    x, y = torch.randn(32, 3), torch.randint(0, 2, (32,))
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]  # CPU batches: fit moves them

    def step(m, batch):
        xb, yb = batch
        return {"loss": nn.functional.cross_entropy(m(xb), yb), "n": len(yb)}

    log = fit(model, batches, step, torch.optim.Adam(model.parameters()), epochs=2, val_loader=batches,
              clip=1.0, log_every=None)
    assert log["updates"] == 8 and all(devicecheck.on_device(p) for p in model.parameters())


def test_setup_installs_the_check_when_asked(monkeypatch):
    from utils.settings import setup

    monkeypatch.setenv("SEQ_DEVICE", "cpu:0")
    monkeypatch.setenv("SEQ_DEVICE_CHECK", "1")
    try:
        run = setup(quiet=True)
        assert run.device == DEV and devicecheck._installed
    finally:
        devicecheck.remove()
    assert not devicecheck._installed


@pytest.mark.parametrize("cell, final", [("LSTM", "h_n"), ("LSTM", "c_n"), ("GRU", "h_n")])
def test_backward_through_the_final_states_of_an_rnn_in_eval_mode_is_refused(check, cell, final):
    """cuDNN refuses the backward whichever output it flows from: the packed classifier reads
    h_n, and only the per-step outputs were once checked."""
    rnn = getattr(nn, cell)(3, 4, batch_first=True).to(DEV).eval()
    _, states = rnn(torch.randn(2, 5, 3, device=DEV))
    state = states if cell == "GRU" else states[("h_n", "c_n").index(final)]
    with pytest.raises(DevicePlacementError, match="cuDNN refuses it"):
        state.sum().backward()


def test_the_packed_classifier_in_eval_mode_is_refused_a_backward(check):
    from utils.classifiers import RecurrentClassifier

    model = RecurrentClassifier(20, 4, 4).to(DEV).eval()  # packed, reads h_n
    tokens, lengths = torch.randint(1, 20, (2, 6), device=DEV), torch.tensor([6, 3], device=DEV)
    with pytest.raises(DevicePlacementError, match="cuDNN refuses it"):
        model(tokens, lengths).sum().backward()
    model.train()
    model(tokens, lengths).sum().backward()  # train mode: allowed


def test_a_random_draw_with_a_generator_on_another_device_is_refused(check):
    """On CUDA a CPU generator cannot draw a tensor on the GPU, nor the reverse."""
    cpu_gen = torch.Generator().manual_seed(0)
    with pytest.raises(DevicePlacementError, match=r"`randn` draws with a CPU generator .*Generator\(device=run.device\)"):
        torch.randn(3, generator=cpu_gen, device=DEV)
    x = torch.zeros(3, device=DEV)
    with pytest.raises(DevicePlacementError, match="`normal_` draws with a CPU generator"):
        x.normal_(generator=cpu_gen)
    with pytest.raises(DevicePlacementError, match="`multinomial` draws with a CPU generator"):
        torch.multinomial(torch.ones(4, device=DEV), 1, generator=cpu_gen)
    dev_gen = torch.Generator(device=DEV).manual_seed(0)
    assert dev_gen.device == DEV and cpu_gen.device == torch.device("cpu")
    with pytest.raises(DevicePlacementError, match="a generator on run.device for a CPU tensor"):
        torch.randn(3, generator=dev_gen)
    assert devicecheck.on_device(torch.randn(3, generator=dev_gen, device=DEV))  # matched: fine
    assert torch.randperm(5, generator=cpu_gen).tolist()  # a CPU draw, moved afterwards: fine


def test_generators_are_plain_again_after_the_check(check):
    devicecheck.remove()
    assert torch.Generator is devicecheck.CPU_GENERATOR
    torch.randn(3, generator=torch.Generator(), device=DEV)  # no check installed: no complaint


def test_a_one_element_cpu_tensor_next_to_a_device_tensor_is_refused(check):
    """Only a zero-dimensional CPU tensor may join a GPU operation; shape (1,) may not."""
    x = torch.ones(3, device=DEV)
    assert (x * torch.tensor(2.0)).shape == (3,)
    with pytest.raises(DevicePlacementError, match=r"mixes a tensor on run.device \(3,\) float32 with a CPU tensor \(1,\)"):
        x * torch.tensor([2.0])
