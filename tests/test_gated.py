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


def _weight_grad_diffs(ours, ref) -> float:
    """Max |diff| between every scratch weight gradient and torch's, mapped to our layout."""
    H, diffs = ours.hidden_size, []
    for idx, cell in enumerate(ours.cells):
        layer, d = divmod(idx, ours.num_directions)
        sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
        g_ih, g_hh, gb_ih, gb_hh = (getattr(ref, n + sfx).grad for n in
                                    ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
        for k, gate in enumerate(cell.GATES):
            rows = slice(k * H, (k + 1) * H)
            diffs.append(getattr(cell, f"W_x{gate}").grad - g_ih[rows].T)
            diffs.append(getattr(cell, f"W_h{gate}").grad - g_hh[rows].T)
            if isinstance(cell, LSTMCell) or gate in "rz":  # one summed bias: the grad of either
                diffs.append(getattr(cell, f"b_{gate}").grad - gb_ih[rows])
        if isinstance(cell, GRUCell):
            diffs += [cell.b_xh.grad - gb_ih[2 * H:], cell.b_hh.grad - gb_hh[2 * H:]]
    return max(t.abs().max().item() for t in diffs)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("num_layers,bidirectional", LAYOUTS)
def test_gradients_match_torch(kind, num_layers, bidirectional):
    """Backward agrees too: every weight, the input and the initial state."""
    torch.manual_seed(0)
    Ref, Ours = (nn.LSTM, LSTMScratch) if kind == "lstm" else (nn.GRU, GRUScratch)
    ref = Ref(D, H, num_layers, batch_first=True, bidirectional=bidirectional)
    ours = Ours(D, H, num_layers, bidirectional).load_from_torch(ref)
    n = num_layers * (2 if bidirectional else 1)
    x_ref, x = _x().requires_grad_(), _x().requires_grad_()
    h0_ref = torch.randn(n, B, H).requires_grad_()  # (L * dirs, B, H)
    h0 = h0_ref.detach().clone().requires_grad_()
    if kind == "lstm":
        c0 = torch.randn(n, B, H)
        s_ref, s = (h0_ref, c0), (h0, c0)
    else:
        s_ref, s = h0_ref, h0
    weights = torch.randn(B, T, H * (2 if bidirectional else 1))  # a loss that mixes all outputs
    (ref(x_ref, s_ref)[0] * weights).sum().backward()
    (ours(x, s)[0] * weights).sum().backward()
    diff = max(_weight_grad_diffs(ours, ref), (x.grad - x_ref.grad).abs().max().item(),
               (h0.grad - h0_ref.grad).abs().max().item())
    print(f"{kind} L={num_layers} bi={bidirectional}: gradient max |diff| = {diff:.1e}")
    assert diff < 1e-5


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_open_gates_sets_the_keep_gate_of_every_layer(kind):
    """After open_gates_, the scratch cell loaded from torch has b_f (LSTM) / b_z (GRU) = bias."""
    from utils.gated import open_gates_

    torch.manual_seed(0)
    Ref, Ours = (nn.LSTM, LSTMScratch) if kind == "lstm" else (nn.GRU, GRUScratch)
    ref = open_gates_(Ref(D, H, num_layers=2, batch_first=True, bidirectional=True), 2.0)
    ours = Ours(D, H, 2, True).load_from_torch(ref)
    for cell in ours.cells:
        keep = cell.b_f if kind == "lstm" else cell.b_z
        assert torch.equal(keep, torch.full((H,), 2.0))


def test_open_gru_keeps_its_state():
    """With the update gate open (z near 1) a GRU step barely moves h: h' = (1 - z) n + z h."""
    from utils.gated import open_gates_

    torch.manual_seed(0)
    gru, h0 = nn.GRU(D, H, batch_first=True), torch.randn(1, B, H)
    x = torch.randn(B, 1, D)
    moved_default = (gru(x, h0)[1] - h0).abs().mean()
    moved_open = (open_gates_(gru, 5.0)(x, h0)[1] - h0).abs().mean()
    print(f"mean |h' - h|: default init {moved_default:.3f}, open gate {moved_open:.3f}")
    assert moved_open < 0.1 * moved_default


def test_open_gates_rejects_other_layers():
    from utils.gated import open_gates_

    with pytest.raises(TypeError, match="nn.LSTM or nn.GRU"):
        open_gates_(nn.RNN(D, H))


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_gated_cells_start_open_by_default(cell):
    """The course's standard: every gated CharLM / SequenceClassifier starts with an open keep
    gate (OPEN_GATE_BIAS), forget_bias=None keeps torch's init, plain RNNs are untouched."""
    from utils.gated import OPEN_GATE_BIAS
    from utils.rnn import CharLM
    from utils.tasks import SequenceClassifier

    for make in (lambda fb="open": CharLM(7, H, cell=cell, forget_bias=fb),
                 lambda fb="open": SequenceClassifier(7, H, 3, cell, forget_bias=fb)):
        torch.manual_seed(0)
        opened = make().rnn
        torch.manual_seed(0)
        default = make(None).rnn
        keep = opened.bias_ih_l0[H:2 * H] + opened.bias_hh_l0[H:2 * H]
        if cell == "rnn":  # no gate: "open" changes nothing
            assert all(torch.equal(a, b) for a, b in zip(opened.parameters(), default.parameters()))
        else:
            assert torch.equal(keep, torch.full((H,), OPEN_GATE_BIAS))
            assert (default.bias_ih_l0[H:2 * H] + default.bias_hh_l0[H:2 * H]).abs().max() < 1


def test_init_keep_gate_rejects_bad_values():
    from utils.gated import init_keep_gate_

    with pytest.raises(ValueError, match="forget_bias must be"):
        init_keep_gate_(nn.LSTM(D, H), "wide open")
    with pytest.raises(ValueError, match="for RNN"):
        init_keep_gate_(nn.RNN(D, H), 2.0)
