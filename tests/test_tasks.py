"""The recall task and SequenceClassifier (utils.tasks)."""

import pytest
import torch
import torch.nn.functional as F

from utils.tasks import SequenceClassifier, make_recall_task, train_recall


def test_recall_task_shapes_and_labels():
    ds = make_recall_task(50, distance=7, n_classes=3, n_noise=5, seed=1)
    x, y = ds.tensors
    assert x.shape == (50, 7) and y.shape == (50,) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 0], y) and int(y.max()) < 3
    assert int(x[:, 1:].min()) >= 3 and int(x[:, 1:].max()) < 8  # noise tokens only
    again = make_recall_task(50, distance=7, n_classes=3, n_noise=5, seed=1).tensors[0]
    assert torch.equal(x, again)  # seeded
    with pytest.raises(ValueError):
        make_recall_task(10, distance=0)


@pytest.mark.parametrize("cell", ["rnn", "irnn", "lstm", "gru"])
def test_classifier_shapes_and_unrolled_path(cell):
    torch.manual_seed(0)
    model = SequenceClassifier(8, 6, 4, cell)
    x = torch.randint(0, 8, (3, 9))  # (B, T)
    logits = model(x)
    logits2, states = model(x, return_states=True)
    assert logits.shape == (3, 4) and states.shape == (3, 9, 6)
    assert torch.allclose(logits, logits2, atol=1e-6)  # same model, stepped by hand
    out, _ = model.rnn(F.one_hot(x, 8).float())
    assert torch.allclose(states, out, atol=1e-6)  # states hold h_1 .. h_T


def test_states_grad_is_the_total_adjoint():
    """dL/dh_t from the probe equals the gradient w.r.t. h_t found by perturbing h_t."""
    torch.manual_seed(0)
    model = SequenceClassifier(8, 5, 4, "rnn").double()
    x = torch.randint(0, 8, (2, 6))
    logits, states = model(x, return_states=True)
    logits.sum().backward()
    # rerun from h_2 with a perturbation and differentiate by autograd through the rest
    e = F.one_hot(x, 8).double()
    _, h = model.rnn(e[:, :3])  # (1, B, H) = h_3 (index 2)
    h = h.detach().requires_grad_()
    out, _ = model.rnn(e[:, 3:], h)
    model.head(out[:, -1]).sum().backward()
    assert torch.allclose(states.grad[:, 2], h.grad[0])


def test_forget_bias_and_bad_cell():
    model = SequenceClassifier(8, 4, 2, "lstm", forget_bias=3.0)
    assert torch.all(model.rnn.bias_ih_l0[4:8] + model.rnn.bias_hh_l0[4:8] == 3.0)
    with pytest.raises(ValueError):
        SequenceClassifier(8, 4, 2, "transformer")
    with pytest.raises(ValueError):
        SequenceClassifier(8, 4, 2, "rnn", forget_bias=1.0)
    gru = SequenceClassifier(8, 4, 2, "gru", forget_bias=2.0)  # the GRU's update gate opens
    assert torch.all(gru.rnn.bias_ih_l0[4:8] + gru.rnn.bias_hh_l0[4:8] == 2.0)


def test_train_recall_solves_a_short_distance():
    out = train_recall("rnn", distance=3, hidden_size=16, n_train=256, n_val=128, steps=60,
                       lr=3e-2, seed=0, device="cpu")
    assert out["val_acc"] > 0.95 and len(out["history"]["loss"]) == 60


@pytest.mark.parametrize("training", [True, False])
def test_accuracy_keeps_the_model_mode(training):
    from utils.tasks import accuracy

    x, y = make_recall_task(8, distance=3).tensors
    model = SequenceClassifier(8, 4, 4, "rnn").train(training)
    accuracy(model, x, y)
    assert model.training is training


def test_train_recall_stops_once_validation_reaches_the_goal_under_a_cap():
    """stop_at turns `steps` into a cap: a run that solves the task stops at the validation
    that first reaches the goal, and reports the updates it used."""
    out = train_recall("rnn", distance=3, hidden_size=16, n_train=256, n_val=128, steps=400,
                       lr=3e-2, seed=0, device="cpu", stop_at=0.9, eval_every=10)
    assert out["stopped"] and out["updates"] < 400 and out["updates"] % 10 == 0
    assert len(out["history"]["loss"]) == out["updates"] and out["val_acc"] >= 0.9
    assert out["history"]["val_acc"][-1] >= 0.9 > max(out["history"]["val_acc"][:-1], default=0)
    capped = train_recall("rnn", distance=3, hidden_size=16, n_train=256, n_val=128, steps=20,
                          lr=1e-4, seed=0, device="cpu", stop_at=0.9, eval_every=10)
    assert not capped["stopped"] and capped["updates"] == 20


def test_recall_sweep_chooses_each_rate_on_validation_and_scores_a_fixed_held_out_set():
    from utils.tasks import SOLVED_ACC, recall_sweep, solved_summary

    variants = {"rnn": ("rnn", None), "gru": ("gru", "open")}
    out = recall_sweep(variants, [3], seeds=[0, 1], lrs=[1e-3, 3e-2], cap=60, grid_distance=3,
                       grid_seeds=[7, 8], device="cpu", hidden_size=8, n_train=64, n_val=32,
                       n_test=64, eval_every=10)
    for name in variants:
        grid = {lr: v for (n, lr), v in out["grid"].items() if n == name}  # extensions included
        assert {1e-3, 3e-2} <= set(grid)
        assert out["lr"][name] == max(grid, key=lambda lr: (grid[lr][0], -grid[lr][1]))
        runs = out["runs"][name, 3]
        assert len(runs) == 2 and all(r["solved"] == (r["test_acc"] >= SOLVED_ACC) for r in runs)
    assert solved_summary([{"solved": True, "test_acc": 1.0}, {"solved": False, "test_acc": 0.5}]) == "1/2 (0.75)"


def test_recall_sweep_chooses_on_grid_seeds_that_the_table_never_reports(monkeypatch):
    """The rate is chosen on the grid seeds at one distance (most runs reaching the goal, then
    fewest updates); the table trains every reported seed at every distance, none reused."""
    import utils.tasks as tasks

    calls = []

    def fake(cell, T, steps, lr, seed, device, forget_bias, stop_at, **kw):
        calls.append((T, lr, seed))
        updates = {1e-3: 300}.get(lr, 100)  # every rate reaches the goal; 1e-3 slowest
        return {"val_acc": 1.0, "test_acc": 1.0, "solved": True, "updates": updates, "run": (T, lr, seed)}

    monkeypatch.setattr(tasks, "train_recall", fake)
    out = tasks.recall_sweep({"rnn": ("rnn", None)}, [3, 6], seeds=[0, 1], lrs=[1e-3, 1e-2],
                             cap=2000, grid_distance=3, grid_seeds=[10, 11], max_extra=0)
    assert out["lr"]["rnn"] == 1e-2 and out["grid"]["rnn", 1e-2] == (2, 100)
    assert sorted(calls) == sorted([(3, lr, s) for lr in (1e-3, 1e-2) for s in (10, 11)]
                                   + [(T, 1e-2, s) for T in (3, 6) for s in (0, 1)])
    for T in (3, 6):
        assert [r["run"] for r in out["runs"]["rnn", T]] == [(T, 1e-2, 0), (T, 1e-2, 1)]
    calls.clear()  # a winner at the grid's edge sends the search one step further out
    out = tasks.recall_sweep({"rnn": ("rnn", None)}, [3], seeds=[0], lrs=[1e-3, 1e-2],
                             cap=2000, grid_distance=3, grid_seeds=[10], max_extra=1)
    assert sorted({lr for _, lr, _ in calls}) == pytest.approx([1e-3, 1e-2, 3e-2])


def test_recall_sweep_grows_the_grid_past_a_winning_edge(monkeypatch):
    import utils.tasks as tasks

    def fake(cell, T, steps, lr, seed, device, forget_bias, stop_at, **kw):
        reached = abs(lr - 3e-2) < 1e-9 or abs(lr - 1e-2) < 1e-9  # 1e-2 and 3e-2 solve; 3e-2 faster
        return {"val_acc": 1.0 if reached else 0.3, "test_acc": 1.0, "solved": reached,
                "updates": 50 if lr > 2e-2 and reached else (200 if reached else steps)}

    monkeypatch.setattr(tasks, "train_recall", fake)
    out = tasks.recall_sweep({"rnn": ("rnn", None)}, [3], seeds=[0], lrs=[3e-3, 1e-2], cap=2000,
                             grid_distance=3, grid_seeds=[10, 11])
    assert out["lr"]["rnn"] == pytest.approx(3e-2)  # found only because 1e-2 won at the edge
    assert out["grid"]["rnn", 3e-3] == (0, 2000) and len(out["grid"]) == 4  # 9e-2 tried, lost
    with pytest.raises(ValueError, match="must differ"):
        tasks.recall_sweep({"rnn": ("rnn", None)}, [3], seeds=[0, 1], lrs=[1e-3], cap=10,
                           grid_distance=3, grid_seeds=[1, 2])


def test_updates_to_solve_is_the_median_over_solved_runs():
    from utils.tasks import updates_to_solve

    runs = [{"solved": True, "updates": 300}, {"solved": False, "updates": 2000},
            {"solved": True, "updates": 100}, {"solved": True, "updates": 200}]
    assert updates_to_solve(runs) == 200 and updates_to_solve(runs[1:2]) is None
    from utils.tasks import seed_updates
    assert seed_updates(runs) == "300 x 100 200"


def test_recall_sweep_ranks_rates_by_runs_solved_before_updates(monkeypatch):
    """At 1e-3 one grid run solves fast and one never does (mean updates (50 + 600) / 2 = 325);
    at 1e-2 both solve in 500: 1e-2 wins, though its mean updates are higher."""
    import utils.tasks as tasks

    def fake(cell, T, steps, lr, seed, device, forget_bias, stop_at, **kw):
        solved = lr == 1e-2 or seed == 10
        updates = 500 if lr == 1e-2 else (50 if solved else steps)
        return {"val_acc": 1.0 if solved else 0.5, "test_acc": 1.0, "solved": solved, "updates": updates}

    monkeypatch.setattr(tasks, "train_recall", fake)
    out = tasks.recall_sweep({"rnn": ("rnn", None)}, [3], seeds=[0], lrs=[1e-3, 1e-2], cap=600,
                             grid_distance=3, grid_seeds=[10, 11], max_extra=0)
    assert out["grid"] == {("rnn", 1e-3): (1, 325), ("rnn", 1e-2): (2, 500)} and out["lr"]["rnn"] == 1e-2


def test_recall_sweep_in_two_processes_equals_one_process():
    """Every run seeds itself, so which process trains which variant changes nothing."""
    from utils.tasks import parallel_workers, recall_sweep, run_parallel

    variants = {"rnn": ("rnn", None), "gru": ("gru", "open")}
    kw = dict(distances={"rnn": [3], "gru": [3, 5]}, seeds=[0, 1], lrs=[1e-2], cap=30,
              grid_distance={"rnn": 3, "gru": 5}, grid_seeds=[10], max_extra=0, device="cpu")
    one, two = recall_sweep(variants, workers=1, **kw), recall_sweep(variants, workers=2, **kw)
    assert one["lr"] == two["lr"] and one["grid"] == two["grid"] and one["runs"].keys() == two["runs"].keys()
    assert set(one["runs"]) == {("rnn", 3), ("gru", 3), ("gru", 5)} and set(one["grid"]) == {("rnn", 1e-2), ("gru", 1e-2)}
    for key, runs in one["runs"].items():
        for a, b in zip(runs, two["runs"][key], strict=True):
            assert a["updates"] == b["updates"] and a["test_acc"] == b["test_acc"]
            assert a["history"]["loss"] == b["history"]["loss"]
    with pytest.raises(ValueError, match="at least 1"):
        run_parallel(dict, [{}], workers=0)
    assert run_parallel(dict, [{"a": 1}, {"b": 2}], workers=2) == [{"a": 1}, {"b": 2}]
    assert parallel_workers("meta") == 1 and parallel_workers("cpu") >= 1


def test_models_from_other_processes_come_back_on_the_jobs_device():
    """A run trained in another process returns plain CPU tensors; the course's device check
    (run.device = cpu:0 in the tests) must see them sent to the device, as the notebook's own are."""
    from course import devicecheck
    from utils.tasks import run_parallel, train_recall

    job = dict(cell="rnn", distance=3, steps=5, lr=1e-2, seed=0, device="cpu:0")
    devicecheck.install(torch.device("cpu:0"))
    try:
        runs = run_parallel(train_recall, [job, dict(job, seed=1)], workers=2)
        assert all(devicecheck.on_device(p) for r in runs for p in r["model"].parameters())
    finally:
        devicecheck.remove()
