"""From-scratch LSTM/GRU (utils.gated) against nn.LSTM / nn.GRU with the same weights."""

import pytest
import torch
from torch import nn

from utils.gated import (
    GRUCell,
    GRUScratch,
    LSTMCell,
    LSTMScratch,
    recurrent_param_count,
)

B, T, D, H = 3, 6, 5, 4
LAYOUTS = [(1, False), (2, False), (1, True), (2, True)]  # (num_layers, bidirectional)


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))  # (B, T, D)


def _max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("num_layers,bidirectional", LAYOUTS)
def test_lstm_matches_torch(num_layers, bidirectional):
    torch.manual_seed(0)
    ref = nn.LSTM(D, H, num_layers, batch_first=True, bidirectional=bidirectional)
    ours = LSTMScratch(D, H, num_layers, bidirectional).load_from_torch(ref)
    dirs = 2 if bidirectional else 1
    h0 = torch.randn(num_layers * dirs, B, H)  # (L * dirs, B, H): non-zero start states
    c0 = torch.randn(num_layers * dirs, B, H)
    out_ref, (h_ref, c_ref) = ref(_x(), (h0, c0))
    out, (h, c) = ours(_x(), (h0, c0))
    diff = _max_diff([out, h, c], [out_ref, h_ref, c_ref])
    print(f"LSTM L={num_layers} bi={bidirectional}: max |diff| = {diff:.1e}")
    assert out.shape == (B, T, dirs * H) and h.shape == c.shape == (num_layers * dirs, B, H)
    assert diff < 1e-5


@pytest.mark.parametrize("num_layers,bidirectional", LAYOUTS)
def test_gru_reset_after_matches_torch(num_layers, bidirectional):
    torch.manual_seed(0)
    ref = nn.GRU(D, H, num_layers, batch_first=True, bidirectional=bidirectional)
    ours = GRUScratch(D, H, num_layers, bidirectional, reset="after").load_from_torch(ref)
    dirs = 2 if bidirectional else 1
    h0 = torch.randn(num_layers * dirs, B, H)  # (L * dirs, B, H)
    out_ref, h_ref = ref(_x(), h0)
    out, h = ours(_x(), h0)
    diff = _max_diff([out, h], [out_ref, h_ref])
    assert out.shape == (B, T, dirs * H) and h.shape == (num_layers * dirs, B, H)
    assert diff < 1e-5


def test_textbook_gru_differs_from_torch():
    torch.manual_seed(0)
    ref = nn.GRU(D, H, batch_first=True)
    before = GRUScratch(D, H, reset="before").load_from_torch(ref)
    diff = (before(_x())[0] - ref(_x())[0]).abs().max().item()
    assert diff > 1e-2, "reset-before should be a different function from PyTorch's GRU"


def test_gru_z_conventions_are_one_model_with_negated_z():
    torch.manual_seed(0)
    ref = nn.GRU(D, H, batch_first=True)
    flipped = GRUScratch(D, H, z_weights="new").load_from_torch(ref)
    cell = flipped.cells[0]
    with torch.no_grad():  # 1 - sigma(a) = sigma(-a)
        for p in (cell.W_xz, cell.W_hz, cell.b_z):
            p.neg_()
    assert torch.allclose(flipped(_x())[0], ref(_x())[0], atol=1e-6)


def test_lstm_cell_gates_and_shapes():
    cell = LSTMCell(D, H)
    x, h, c = torch.randn(B, D), torch.zeros(B, H), torch.zeros(B, H)  # (B, D), (B, H), (B, H)
    (h1, c1), gates = cell(x, (h, c), return_gates=True)
    assert h1.shape == c1.shape == (B, H)
    assert set(gates) == {"i", "f", "g", "o", "c"}
    assert all(0 < gates[k].min() and gates[k].max() < 1 for k in "ifo")  # sigmoid gates
    assert torch.allclose(c1, gates["i"] * gates["g"])  # c0 = 0: only the write survives


def test_gru_cell_shapes_and_bad_args():
    h = GRUCell(D, H)(torch.randn(B, D), torch.zeros(B, H))  # (B, H)
    assert h.shape == (B, H)
    with pytest.raises(ValueError, match="reset"):
        GRUCell(D, H, reset="middle")
    with pytest.raises(ValueError, match="shape"):
        LSTMScratch(D, H)(torch.randn(B, T, D + 1))
    with pytest.raises(ValueError, match="cannot load"):
        LSTMScratch(D, H).load_from_torch(nn.GRU(D, H, batch_first=True))


def test_return_gates_layout():
    out, _, internals = LSTMScratch(D, H, 2, True)(_x(), return_gates=True)
    assert out.shape == (B, T, 2 * H) and len(internals) == 4  # 2 layers x 2 directions
    assert internals[1]["f"].shape == (B, T, H) and len(internals[1]["h_steps"]) == T


@pytest.mark.parametrize("cell,module", [("rnn", nn.RNN), ("gru", nn.GRU), ("lstm", nn.LSTM)])
@pytest.mark.parametrize("num_layers,bidirectional", LAYOUTS)
def test_param_count_formula(cell, module, num_layers, bidirectional):
    ref = module(D, H, num_layers, bidirectional=bidirectional)
    assert recurrent_param_count(cell, D, H, num_layers, bidirectional) == sum(
        p.numel() for p in ref.parameters())


def test_scratch_lstm_has_one_bias_per_gate():
    # the scratch cell merges torch's two biases, so it has 4H fewer parameters per cell
    ours = sum(p.numel() for p in LSTMScratch(D, H).parameters())
    assert ours == recurrent_param_count("lstm", D, H, two_biases=False)


def test_scratch_lstm_overfits_a_tiny_batch():
    torch.manual_seed(0)
    x, y = torch.randn(4, 5, 3), torch.tensor([0, 1, 0, 1])  # (B, T, D), (B,)
    lstm, head = LSTMScratch(3, 8), nn.Linear(8, 2)
    params = [*lstm.parameters(), *head.parameters()]
    for _ in range(60):  # plain gradient descent: no optimizer start-up cost in a unit test
        loss = nn.functional.cross_entropy(head(lstm(x)[0][:, -1]), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= 1.0 * g
    assert loss.item() < 0.05
