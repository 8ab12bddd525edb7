"""The learning-rate schedules against their closed forms, at every step and across a resume."""

import math

import pytest
import torch

from utils.schedules import (
    InverseSqrt,
    WarmupCosine,
    WarmupStableDecay,
    inverse_sqrt_factor,
    start_of_longer_plan,
    warmup_cosine,
    warmup_cosine_factor,
)


def make_opt(lr=1.0):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def lrs(opt, sched, n):
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])  # the rate this optimizer step uses
        opt.step()
        sched.step()
    return out


def test_closed_forms_at_landmarks():
    assert warmup_cosine_factor(0, 10, 0.0) == pytest.approx(0.1)
    assert warmup_cosine_factor(9, 10, 0.0) == pytest.approx(1.0)
    assert warmup_cosine_factor(50, 10, 0.5) == pytest.approx(0.5)
    assert warmup_cosine_factor(99, 10, 1.0) == pytest.approx(0.0)
    assert warmup_cosine_factor(99, 10, 1.0, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert warmup_cosine_factor(5, 0, 0.0) == 1.0  # no warm-up
    assert inverse_sqrt_factor(3, 4) == pytest.approx(1.0)  # peak at step w - 1
    assert inverse_sqrt_factor(15, 4) == pytest.approx(0.5)  # 1/sqrt(16/4)


def test_warmup_cosine_matches_formula_every_step():
    w, S, m, base = 5, 40, 0.1, 3e-3
    opt = make_opt(base)
    got = lrs(opt, WarmupCosine(opt, w, S, min_lr_ratio=m), 50)
    for s, lr in enumerate(got):
        warm = min(1.0, (s + 1) / w)
        p = min(max((s - w) / (S - w), 0.0), 1.0)
        assert lr == pytest.approx(base * warm * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * p))))
    assert got[-1] == pytest.approx(m * base)  # flat after the budget


def test_inverse_sqrt_matches_the_paper():
    d_model, w = 512, 4000
    peak = d_model ** -0.5 * w ** -0.5
    opt = make_opt(peak)
    sched = InverseSqrt(opt, w)
    for s in range(0, 12_000, 997):
        sched.last_epoch = s
        n = s + 1  # the paper counts steps from 1
        paper = d_model ** -0.5 * min(n ** -0.5, n * w ** -1.5)
        assert sched.get_lr()[0] == pytest.approx(paper)


def test_resume_from_state_dict_continues_the_same_curve():
    opt = make_opt()
    full = lrs(opt, WarmupCosine(opt, 4, 30), 30)
    opt = make_opt()
    sched = WarmupCosine(opt, 4, 30)
    first = lrs(opt, sched, 12)
    state, opt_state = sched.state_dict(), opt.state_dict()
    opt2 = make_opt()  # resume as PyTorch expects: build both, then load both states
    sched2 = WarmupCosine(opt2, 4, 30)
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(state)
    assert first + lrs(opt2, sched2, 18) == pytest.approx(full)


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="warmup_steps < total_steps"):
        WarmupCosine(make_opt(), 10, 10)
    with pytest.raises(ValueError, match="warmup_steps >= 1"):
        InverseSqrt(make_opt(), 0)
    with pytest.raises(TypeError, match="Optimizer"):
        WarmupCosine([torch.zeros(1)], 1, 2)


def test_no_warmup_is_a_pure_cosine_and_inverse_sqrt_resumes():
    opt = make_opt(2.0)
    got = lrs(opt, WarmupCosine(opt, 0, 20), 20)
    assert got == pytest.approx([2.0 * 0.5 * (1 + math.cos(math.pi * s / 20)) for s in range(20)])
    opt = make_opt()
    full = lrs(opt, InverseSqrt(opt, 5), 25)
    assert full == pytest.approx([min((s + 1) / 5, math.sqrt(5 / (s + 1))) for s in range(25)])
    opt = make_opt()
    sched = InverseSqrt(opt, 5)
    first = lrs(opt, sched, 9)
    opt2 = make_opt()
    sched2 = InverseSqrt(opt2, 5)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert first + lrs(opt2, sched2, 16) == pytest.approx(full)


def test_start_of_longer_plan_follows_the_longer_plan_and_refuses_a_longer_run():
    plan = warmup_cosine(5)
    short = start_of_longer_plan(plan, updates=10, schedule_updates=40)
    for step in range(10):  # fit passes the share of the *short* run as progress; it is ignored
        assert short(step, (step + 1) / 10) == pytest.approx(plan(step, step / 40))
    assert short(9, 1.0) > plan(9, 1.0)  # the short run's own cosine would be at 0 by now
    for bad in (None, 0, 41):
        with pytest.raises(ValueError, match="schedule_updates"):
            start_of_longer_plan(plan, updates=bad, schedule_updates=40)


def test_warmup_stable_decay_holds_until_told_then_decays_to_zero_and_ends():
    opt = make_opt()
    sched = WarmupStableDecay(opt, 4, 1000, decay_share=0.2, round_to=5)
    seen = lrs(opt, sched, 20)
    assert seen[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and seen[4:] == pytest.approx([1.0] * 16)
    sched.start_decay()  # after 20 updates: a fifth of them, rounded up to a multiple of 5
    sched.start_decay()  # no effect once it has begun
    assert (sched.decay_start, sched.decay_steps, sched.done) == (20, 5, False)
    assert lrs(opt, sched, 5) == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    assert sched.done and lrs(opt, sched, 2) == [0.0, 0.0]


def test_warmup_stable_decay_starts_by_itself_so_the_run_ends_at_its_budget_and_resumes():
    opt = make_opt()
    full = lrs(opt, WarmupStableDecay(opt, 0, 12, decay_share=0.5), 12)
    assert full == pytest.approx([1.0] * 8 + [1.0, 0.75, 0.5, 0.25])  # decay from 12 / 1.5 = 8
    opt = make_opt()
    sched = WarmupStableDecay(opt, 0, 12, decay_share=0.5)
    first = lrs(opt, sched, 9)
    opt2 = make_opt()
    sched2 = WarmupStableDecay(opt2, 0, 12, decay_share=0.5)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert first + lrs(opt2, sched2, 3) == pytest.approx(full) and sched2.done
    with pytest.raises(ValueError, match="decay_share"):
        WarmupStableDecay(make_opt(), 0, 12, decay_share=0)


def test_warmup_stable_decay_starts_by_itself_no_later_than_its_share_allows():
    """100 / 1.2 = 83.3 steps: the decay starts at 83 (rounded down), so it lasts 17 steps, at
    least a fifth of the 83 before it; rounded up to 84 it would last 16 < 84 / 5."""
    opt = make_opt()
    sched = WarmupStableDecay(opt, 0, 100, decay_share=0.2)
    seen = lrs(opt, sched, 100)
    assert (sched.decay_start, sched.decay_steps) == (83, 17) and sched.done
    assert seen[:84] == pytest.approx([1.0] * 84)
    assert seen[83:] == pytest.approx([1 - j / 17 for j in range(17)])


def test_a_late_start_decay_still_ends_at_the_budget():
    """Told to decay one update before the latest start, a fifth of the 82 updates taken, rounded
    up to the interval of 10, would run to 102: the decay is cut to the 18 updates left, and the
    rate reaches 0 exactly at the budget, never passing it."""
    opt = make_opt()
    sched = WarmupStableDecay(opt, 0, 100, decay_share=0.2, round_to=10)
    lrs(opt, sched, 82)
    sched.start_decay()
    assert (sched.decay_start, sched.decay_steps) == (82, 18)
    assert lrs(opt, sched, 18) == pytest.approx([1 - j / 18 for j in range(18)])
    assert sched.done and lrs(opt, sched, 2) == [0.0, 0.0]  # at the budget, and after it
