import itertools
import math

import pytest
import torch
import torch.nn.functional as F
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
    log = fit(model, loader, _step, opt, epochs=15, val_loader=loader, clip=1.0)
    per_update = {"loss", "lr", "grad_norm"}
    per_eval = {"eval_update", "eval_train_s", "train_loss", "train_acc", "val_loss", "val_acc"}
    assert set(log) == per_update | per_eval | {"updates", "epochs", "items", "train_s"}
    assert all(len(log[k]) == 60 for k in per_update) and all(len(log[k]) == 15 for k in per_eval)
    assert log["updates"] == 60 and log["epochs"] == 15 and log["items"] == 15 * 64
    assert log["eval_update"] == list(range(4, 61, 4))
    assert log["val_loss"][-1] < log["val_loss"][0] and log["val_acc"][-1] > 0.9
    assert "epoch 15/15" in capsys.readouterr().out and not model.training


def _random_batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(8, 3, generator=g)
        yield x, (x[:, 0] > 0).long()


@pytest.fixture
def fake_clock(monkeypatch):
    """Training time = number of training forward passes (validation is not counted)."""
    import types

    import utils.train

    clock = {"t": 0.0}

    def tick(model, batch):
        clock["t"] += model.training
        return _step(model, batch)

    monkeypatch.setattr(utils.train, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))
    return tick


def test_budgets_updates_epochs_and_a_seconds_cap(fake_clock):
    model, loader = nn.Linear(3, 2), _toy_problem()  # 4 batches per epoch
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert fit(model, _random_batches(), _step, opt, updates=7, log_every=None)["updates"] == 7
    assert fit(model, loader, _step, opt, epochs=2, log_every=None)["updates"] == 8
    capped = fit(model, loader, fake_clock, opt, epochs=5, seconds=6, log_every=None)
    assert capped["updates"] == 6 and capped["train_s"] == 6 and capped["epochs"] == 1.5
    timed = fit(model, _random_batches(), fake_clock, opt, seconds=5, log_every=None)
    assert timed["updates"] == 5 and timed["epochs"] is None  # an endless source has no epochs


def test_schedule_progress_is_the_share_of_the_budget_that_ends_the_run(fake_clock):
    model = nn.Linear(3, 2)
    seen = []

    def schedule(step, progress):
        seen.append((step, progress))
        return 1.0

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(model, _random_batches(), _step, opt, updates=4, schedule=schedule, log_every=None)
    assert seen == [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75)]
    seen.clear()  # 10 updates, but a 4-second cap ends the run first: progress follows time
    fit(model, _random_batches(), fake_clock, opt, updates=10, seconds=4, schedule=schedule, log_every=None)
    assert seen == [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75)]


def test_schedule_function_and_lr_scheduler_set_the_rate_of_each_update():
    from utils.schedules import WarmupCosine, warmup_cosine

    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    by_function = fit(model, _random_batches(), _step, opt, updates=6, log_every=None,
                      schedule=lambda s, p: warmup_cosine(2)(s, (s - 2) / 4))["lr"]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    by_scheduler = fit(model, _random_batches(), _step, opt, updates=6, log_every=None,
                       schedule=WarmupCosine(opt, 2, 6))["lr"]
    assert by_function == pytest.approx(by_scheduler) and by_function[:2] == pytest.approx([0.05, 0.1])


def test_eval_every_keep_best_and_the_final_validation():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    scores = iter([0.3, 0.9, 0.5, 0.4])
    weights = []

    def validate(m):
        weights.append(m.weight.detach().clone())
        return {"acc": next(scores)}

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    log = fit(model, _random_batches(), _step, opt, updates=10, validate=validate, eval_every=3,
              keep_best=("val_acc", "max"), log_every=None)
    assert log["eval_update"] == [3, 6, 9, 10] and log["val_acc"] == [0.3, 0.9, 0.5, 0.4]
    assert log["best_update"] == 6 and torch.equal(model.weight, weights[1])
    with pytest.raises(ValueError, match="keep_best names 'val_loss'"):
        fit(model, _random_batches(), _step, opt, updates=2, validate=lambda m: {"acc": 0.5},
            keep_best=("val_loss", "min"), log_every=None)


def test_hooks_see_the_gradients_and_the_update():
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    log = fit(model, _random_batches(), _step, opt, updates=3, log_every=None,
              on_gradients=lambda m: {"g": float(m.weight.grad.norm())},
              on_update=lambda m: {"w": float(m.weight.detach().norm())})
    assert len(log["g"]) == len(log["w"]) == 3 and log["w"][-1] == pytest.approx(float(model.weight.detach().norm()))


def test_a_non_finite_loss_stops_the_run():
    model = nn.Linear(3, 2)

    def step(m, batch):
        return {"loss": _step(m, batch)["loss"] * float("nan"), "n": 8}

    log = fit(model, _random_batches(), step, torch.optim.SGD(model.parameters(), lr=0.1), updates=50,
              log_every=None)
    assert log["updates"] == 1


@pytest.mark.parametrize("kwargs, match", [
    ({}, "give a budget"), ({"updates": 3, "epochs": 1}, "not both"), ({"updates": 0}, "positive"),
])
def test_fit_refuses_a_bad_budget(kwargs, match):
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=match):
        fit(model, _toy_problem(), _step, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
    with pytest.raises(ValueError, match="endless batch source"):
        fit(model, _random_batches(), _step, torch.optim.SGD(model.parameters(), lr=0.1), epochs=1)
    with pytest.raises(ValueError, match="no batches"):
        fit(model, [], _step, torch.optim.SGD(model.parameters(), lr=0.1), epochs=1)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_precisions_train_in_float32_weights(precision):
    torch.manual_seed(0)
    model, loader = nn.Linear(3, 2), _toy_problem()
    log = fit(model, loader, _step, torch.optim.SGD(model.parameters(), lr=0.5), epochs=5,
              precision=precision, log_every=None)
    assert model.weight.dtype == torch.float32 and log["train_loss"][-1] < log["train_loss"][0]
    with pytest.raises(ValueError, match="precision must be one of"):
        fit(model, loader, _step, torch.optim.SGD(model.parameters(), lr=0.5), epochs=1, precision="fp8")


def test_to_device_moves_nested_batches():
    from collections import namedtuple

    from utils.text import Batch
    from utils.train import to_device

    Pair = namedtuple("Pair", "x y")
    meta = torch.device("meta")
    batch = {"a": (torch.zeros(2), [torch.ones(1)]), "p": Pair(torch.zeros(1), 3), "flag": True,
             "b": Batch(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, dtype=torch.long),
                        torch.ones(1, 2, dtype=torch.bool))}
    moved = to_device(batch, meta)
    assert moved["a"][0].is_meta and moved["a"][1][0].is_meta and isinstance(moved["p"], Pair)
    assert moved["p"].x.is_meta and moved["p"].y == 3 and moved["flag"] is True and moved["b"].tokens.is_meta


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


def test_keep_best_never_keeps_a_nan_validation():
    """NaN > x is always False: a first NaN validation once stayed "best" for the whole run."""
    scores, weights = iter([float("nan"), 0.2, 0.3]), []

    def validate(m):
        weights.append(m.weight.detach().clone())
        return {"loss": next(scores)}

    model = nn.Linear(3, 2)
    log = fit(model, _random_batches(), _step, torch.optim.SGD(model.parameters(), lr=0.1), updates=3,
              validate=validate, eval_every=1, keep_best=("val_loss", "min"), log_every=None)
    assert log["best_update"] == 2 and torch.equal(model.weight, weights[1])


def test_a_second_fit_on_the_same_optimizer_schedules_from_the_same_base():
    """fit once left the last scheduled rate in the optimizer, and the next fit took it as the
    base: a schedule of 0.5 on a base of 0.1 ran at 0.05, then at 0.025."""
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        log = fit(model, _random_batches(), _step, opt, updates=2, schedule=lambda s, p: 0.5, log_every=None)
        assert log["lr"] == pytest.approx([0.05, 0.05]) and opt.param_groups[0]["lr"] == 0.1


def test_validation_time_is_not_training_time(monkeypatch):
    """train_s counts the updates only: each training forward costs 1 s on a fake clock, each
    validation forward 100 s."""
    import types

    import utils.train

    clock = {"t": 0.0}

    def step(model, batch):
        clock["t"] += 1.0 if model.training else 100.0
        return _step(model, batch)

    monkeypatch.setattr(utils.train, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))
    model = nn.Linear(3, 2)
    val = [next(_random_batches(1))]
    log = fit(model, _random_batches(), step, torch.optim.SGD(model.parameters(), lr=0.1), updates=4,
              val_loader=val, eval_every=2, log_every=None)
    assert log["train_s"] == 4 and log["eval_train_s"] == [2, 4]


def test_time_precisions_times_the_timed_updates_only(monkeypatch):
    """Milliseconds per update over the `updates` timed ones: the warm-up update (here 50 s on a
    fake clock, against 1 s for each later one) is neither timed nor counted."""
    import types

    import utils.train
    from utils.train import time_precisions

    clock = {"t": 0.0, "calls": 0}

    def step(model, batch):
        clock["calls"] += 1
        clock["t"] += 50.0 if clock["calls"] == 1 else 1.0
        return _step(model, batch)

    monkeypatch.setattr(utils.train, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))
    times = time_precisions(nn.Linear(3, 2), next(_random_batches()), step, precisions=["fp32"], updates=2)
    assert times == {"fp32": pytest.approx(1000.0)}


def test_stop_when_ends_training_at_the_validation_that_meets_it():
    """stop_when is asked after each validation; True ends the run there (the budget is a cap)."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    batches = itertools.repeat((torch.randn(8, 2), torch.randn(8, 1)))
    step = lambda m, b: {"loss": F.mse_loss(m(b[0]), b[1]), "n": 8}  # noqa: E731
    seen = []
    log = fit(model, batches, step, torch.optim.SGD(model.parameters(), lr=0.1), updates=100,
              validate=lambda m: {"calls": len(seen)}, eval_every=5, log_every=None,
              stop_when=lambda stats: seen.append(stats) or len(seen) == 3)
    assert log["updates"] == 15 and log["eval_update"] == [5, 10, 15]
    assert "val_calls" in seen[0] and "train_loss" in seen[0]


def test_no_gain_for_stops_patience_validations_after_the_best_and_keep_best_restores_it():
    from utils.train import no_gain_for

    stop = no_gain_for(patience=2)
    assert [stop({"val_acc": a}) for a in (0.5, 0.7, 0.6, 0.7, 0.8, float("nan"), 0.79)] == \
        [False, False, False, True, False, False, True]
    down = no_gain_for(1, key="val_loss", mode="min")
    assert [down({"val_loss": v}) for v in (3.0, 2.0, 2.5)] == [False, False, True]
    with pytest.raises(KeyError, match="no_gain_for watches 'val_acc'"):
        no_gain_for()({"val_loss": 1.0})
    with pytest.raises(ValueError, match="patience"):
        no_gain_for(0)
    # in fit: validation accuracy scripted to peak at the 2nd epoch -> stops after the 3rd
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    data = [(torch.randn(8, 2), torch.randn(8, 1))] * 2
    step = lambda m, b: {"loss": F.mse_loss(m(b[0]), b[1]), "n": 8}  # noqa: E731
    accs = iter([0.6, 0.9, 0.8, 0.95, 0.99])
    log = fit(model, data, step, torch.optim.SGD(model.parameters(), lr=0.1), epochs=5,
              validate=lambda m: {"acc": next(accs)}, keep_best=("val_acc", "max"),
              stop_when=no_gain_for(1), log_every=None)
    assert log["val_acc"] == [0.6, 0.9, 0.8] and log["best_update"] == 4


def test_choose_rate_extends_a_grid_whose_edge_wins_and_ignores_non_finite_losses():
    from utils.train import choose_rate

    tried = []

    def bowl(lr):  # lowest at 1e-1, above the grid; 3e-1 and up diverge
        tried.append(lr)
        return math.nan if lr > 0.2 else abs(math.log10(lr) + 1)

    best, losses = choose_rate(bowl, [1e-3, 3e-3, 1e-2])
    assert tried[:3] == [1e-3, 3e-3, 1e-2] and len(tried) == 5  # two steps out, no further
    assert best == pytest.approx(0.09) and list(losses) == sorted(losses)
    best, losses = choose_rate(bowl, [3e-2, 1e-1, 3e-1])  # an interior winner: nothing added
    assert best == 1e-1 and len(losses) == 3
    best, losses = choose_rate(lambda lr: lr, [1e-2, 1e-3], max_extra=1)  # the low edge wins
    assert best == pytest.approx(1e-3 / 3) and len(losses) == 3
    with pytest.raises(ValueError, match="positive"):
        choose_rate(bowl, [])


def test_improves_is_the_one_nan_safe_better():
    from utils.compare import improves

    assert improves(1.0, 2.0) and not improves(2.0, 1.0) and improves(2.0, 1.0, "max")
    assert not improves(1.0, 1.0)  # a tie keeps the first
    for bad in (math.nan, math.inf, -math.inf):  # a non-finite score never improves...
        assert not improves(bad, 1.0) and not improves(bad, None) and not improves(bad, 1.0, "max")
        assert improves(5.0, bad) and improves(5.0, bad, "max")  # ...and any finite one beats it
    assert improves(5.0, None)
    with pytest.raises(ValueError, match="mode"):
        improves(1.0, 2.0, "lowest")


def test_choose_rate_never_picks_a_nan_that_comes_first_or_a_minus_inf_loss():
    """min() keeps a NaN it starts with (x < NaN is always False) and takes -inf as the lowest:
    both are diverged runs. The existing grid test had its NaN last, where min() skips it."""
    from utils.train import choose_rate

    losses = {1e-3: math.nan, 1e-2: 0.5, 3e-2: 0.4, 1e-1: 0.6}
    assert choose_rate(losses.get, list(losses), max_extra=0)[0] == 3e-2
    losses = {1e-3: 0.5, 1e-2: 0.4, 3e-2: -math.inf, 1e-1: 0.6}
    assert choose_rate(losses.get, list(losses), max_extra=0)[0] == 1e-2


def test_no_gain_for_never_counts_a_non_finite_validation_as_a_gain():
    """A NaN first must not become the best to beat, and a loss of -inf (a diverged run) is no
    gain: it once reset the patience as the best loss ever seen."""
    from utils.train import no_gain_for

    stop = no_gain_for(2, key="val_loss", mode="min")
    assert [stop({"val_loss": v}) for v in (math.nan, 2.0, 1.0, -math.inf, 1.5)] == [False] * 4 + [True]
