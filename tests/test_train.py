import pytest
import torch
from torch import nn

from utils.train import evaluate, fit, load_checkpoint, save_checkpoint


def _toy_problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 0.5]) > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    return loader


def _step(model, batch):
    x, y = batch
    logits = model(x)
    return {"loss": nn.functional.cross_entropy(logits, y), "n": len(y),
            "acc": (logits.argmax(-1) == y).float().mean()}


def test_fit_overfits_a_toy_problem_and_records_history(capsys):
    torch.manual_seed(0)
    model, loader = nn.Linear(3, 2), _toy_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    history = fit(model, loader, _step, opt, epochs=15, val_loader=loader, clip=1.0)
    assert set(history) == {"train_loss", "train_acc", "val_loss", "val_acc", "epoch_time"}
    assert len(history["val_loss"]) == 15
    assert history["val_loss"][-1] < history["val_loss"][0] and history["val_acc"][-1] > 0.9
    assert "epoch 15/15" in capsys.readouterr().out


def test_evaluate_weights_batches_by_item_count():
    model = nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
    loader = [(x[:4], y[:4]), (x[4:], y[4:])]  # unequal batches
    expected = nn.functional.cross_entropy(model(x), y).item()
    assert evaluate(model, loader, _step)["loss"] == pytest.approx(expected, rel=1e-6)


def test_fit_rejects_empty_loader():
    with pytest.raises(ValueError, match="no items"):
        evaluate(nn.Linear(3, 2), [], _step)


def test_checkpoint_roundtrip_and_config_mismatch(tmp_path):
    model = nn.Linear(3, 2)
    save_checkpoint(tmp_path / "m.pt", model, config={"hidden": 2})
    other = nn.Linear(3, 2)
    load_checkpoint(tmp_path / "m.pt", other, config={"hidden": 2})
    assert torch.equal(model.weight, other.weight)
    with pytest.raises(ValueError, match="config"):
        load_checkpoint(tmp_path / "m.pt", other, config={"hidden": 3})


def test_checkpoint_config_with_numpy_scalars_loads(tmp_path):
    """numpy scalars in the config become Python numbers (weights_only loading refuses numpy)."""
    import numpy as np

    model, config = nn.Linear(2, 2), {"lr": np.float64(0.1), "sizes": [np.int64(3)], "ok": True}
    save_checkpoint(tmp_path / "c.pt", model, config)
    state = load_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2), config)
    assert state["config"] == {"lr": 0.1, "sizes": [3], "ok": True}
    assert type(state["config"]["lr"]) is float


def test_checkpoint_refuses_unstorable_config(tmp_path):
    with pytest.raises(TypeError, match="config.opt"):
        save_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2), {"opt": object()})
    assert not (tmp_path / "c.pt").exists()


def test_checkpoint_extras_with_numpy_scalars_load(tmp_path):
    """Extras go through the same conversion as the config (they used to be written as numpy
    objects that `load_checkpoint`, weights_only, then refused to read)."""
    import numpy as np

    model = nn.Linear(2, 2)
    save_checkpoint(tmp_path / "c.pt", model, best_epoch=np.int64(3),
                    history={"val_loss": [np.float32(0.5), 0.25]}, table=torch.arange(3))
    state = load_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2))
    assert state["best_epoch"] == 3 and type(state["best_epoch"]) is int
    assert state["history"] == {"val_loss": [0.5, 0.25]}
    assert torch.equal(state["table"], torch.arange(3))  # tensors are stored as they are
    with pytest.raises(TypeError, match="extra.note"):
        save_checkpoint(tmp_path / "d.pt", model, note=object())
    assert not (tmp_path / "d.pt").exists()
