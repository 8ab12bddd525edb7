"""Tests of utils.decoding on a tiny fixed "model" and on a small recurrent one."""

import math

import pytest
import torch
from torch import nn

from utils.decoding import beam_search, greedy_decode, length_normalize, sample, select_state

EOS, V = 1, 6


class TinyLM(nn.Module):
    """A GRU language model with the decoding interface: step(prefix, state) -> (log_probs, state)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.cell, self.out = nn.Embedding(V, 8), nn.GRUCell(8, 8), nn.Linear(8, V)

    def start(self, B, device="cpu"):
        return {"h": torch.zeros(B, 8, device=device)}

    def step(self, prefix, state):
        h = self.cell(self.embed(prefix[:, -1]), state["h"])  # (B, 8)
        return torch.log_softmax(self.out(h), dim=-1), {"h": h}


def table_step(table):
    """A 'model' whose next-token log-probs depend only on the last token: table (V, V)."""
    def step(prefix, state):
        return table[prefix[:, -1]], state
    return step


def prefixes(B, first=0):
    return torch.full((B, 1), first, dtype=torch.long)


def test_select_state_handles_nested_structures():
    state = {"h": torch.arange(6).view(3, 2), "pair": (torch.arange(3), None)}
    out = select_state(state, torch.tensor([2, 0]))
    assert out["h"].tolist() == [[4, 5], [0, 1]] and out["pair"][0].tolist() == [2, 0]
    with pytest.raises(TypeError, match="cannot select"):
        select_state({"x": 3}, torch.tensor([0]))


def test_greedy_stops_at_eos_and_pads():
    table = torch.full((V, V), -10.0)
    table[0, 2], table[2, EOS], table[3, 4], table[4, 4] = 0.0, 0.0, 0.0, 0.0
    prefix = torch.tensor([[0], [3]])
    out = greedy_decode(table_step(table), prefix, None, max_len=5, eos_id=EOS, pad_id=5)
    assert out[0].tolist() == [0, 2, EOS, 5, 5, 5] and out[1].tolist() == [3, 4, 4, 4, 4, 4]


def test_beam_one_equals_greedy_on_a_model():
    model = TinyLM().eval()
    with torch.no_grad():
        greedy = greedy_decode(model.step, prefixes(4), model.start(4), 12, EOS, pad_id=-1)
        beams = beam_search(model.step, prefixes(4), model.start(4), 12, EOS, beam_size=1)
    for row, hyps in zip(greedy[:, 1:].tolist(), beams):
        assert [t for t in row if t != -1] == hyps[0].tokens


def test_beam_finds_what_greedy_misses():
    # from 0: token 2 looks best (0.6) but every continuation is poor; token 3 (0.4) then eos (1.0)
    p = torch.full((V, V), 1e-9)
    p[0, 2], p[0, 3] = 0.6, 0.4
    p[2, 4], p[2, 5] = 0.5, 0.5
    p[4, EOS], p[5, EOS], p[3, EOS] = 1.0, 1.0, 1.0
    table = (p / p.sum(-1, keepdim=True)).log()
    greedy = greedy_decode(table_step(table), prefixes(1), None, 5, EOS)
    best = beam_search(table_step(table), prefixes(1), None, 5, EOS, beam_size=3, alpha=0.0)[0][0]
    assert greedy[0, 1:].tolist() == [2, 4, EOS]  # 0.6 * 0.5 = 0.30
    assert best.tokens == [3, EOS] and math.isclose(best.log_prob, math.log(0.4), rel_tol=1e-4)


def test_beam_hypotheses_sorted_by_normalized_score_and_end_at_eos():
    model = TinyLM(seed=3).eval()
    with torch.no_grad():
        results = beam_search(model.step, prefixes(3), model.start(3), 8, EOS, beam_size=4,
                              alpha=1.0)
    for hyps in results:
        assert 1 <= len(hyps) <= 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:
            assert math.isclose(h.score, length_normalize(h.log_prob, len(h.tokens), 1.0))
            assert EOS not in h.tokens[:-1]  # nothing after an eos
            assert h.tokens[-1] == EOS or len(h.tokens) == 8


def test_beam_log_prob_is_the_sum_of_token_log_probs():
    model = TinyLM(seed=1).eval()
    with torch.no_grad():
        hyp = beam_search(model.step, prefixes(1), model.start(1), 6, EOS, beam_size=3)[0][0]
        prefix, state, total = prefixes(1), model.start(1), 0.0
        for tok in hyp.tokens:
            log_probs, state = model.step(prefix, state)
            total += float(log_probs[0, tok])
            prefix = torch.cat([prefix, torch.tensor([[tok]])], dim=1)
    assert math.isclose(total, hyp.log_prob, rel_tol=1e-4, abs_tol=1e-4)


def three_inputs():
    """A batch of three different inputs: other first tokens and other start states."""
    g = torch.Generator().manual_seed(5)
    return torch.tensor([[0], [2], [4]]), {"h": torch.randn(3, 8, generator=g)}


def exhaustive(model, prefix, state, max_len, alpha):
    """Every hypothesis of one input (1, t) by brute force: tokens -> (log p, log p / len^alpha).

    A hypothesis ends at its first eos (which counts in its length) or after max_len tokens.
    """
    found = {}

    def visit(tokens, prefix, state, log_p):
        log_probs, state = model.step(prefix, state)  # (1, V)
        for v in range(V):
            seq, lp = tokens + (v,), log_p + log_probs[0, v].item()
            if v == EOS or len(seq) == max_len:
                found[seq] = (lp, lp / len(seq) ** alpha)
            else:
                visit(seq, torch.cat([prefix, torch.tensor([[v]])], 1), state, lp)

    visit((), prefix, state, 0.0)
    return found


@pytest.mark.parametrize("alpha", [0.0, 0.7, 1.0])
@torch.no_grad()
def test_beam_as_wide_as_every_hypothesis_is_exhaustive_search_for_each_input(alpha):
    # V = 6, max_len = 3: 1 + 5 + 25 hypotheses end in eos, 125 are cut at max_len
    model = TinyLM(seed=2).eval()
    prefix, state = three_inputs()
    results = beam_search(model.step, prefix, state, 3, EOS, beam_size=156, alpha=alpha)
    for b, hyps in enumerate(results):
        ref = exhaustive(model, prefix[b:b + 1], select_state(state, torch.tensor([b])), 3, alpha)
        got = {tuple(h.tokens): (h.log_prob, h.score) for h in hyps}
        assert got.keys() == ref.keys()
        worst = max(abs(got[k][i] - ref[k][i]) for k in ref for i in (0, 1))
        assert worst < 1e-5, f"input {b}: log p or score off by {worst:.1e}"
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        best = max(ref, key=lambda k: ref[k][1])
        assert math.isclose(hyps[0].score, ref[best][1], abs_tol=1e-5)


@torch.no_grad()
def test_beam_search_of_a_batch_equals_one_input_at_a_time():
    model = TinyLM(seed=4).eval()
    prefix, state = three_inputs()
    together = beam_search(model.step, prefix, state, 8, EOS, beam_size=3)
    for b in range(3):
        alone = beam_search(model.step, prefix[b:b + 1], select_state(state, torch.tensor([b])),
                            8, EOS, beam_size=3)[0]
        assert [h.tokens for h in together[b]] == [h.tokens for h in alone], f"input {b}"
        for h, a in zip(together[b], alone):
            assert math.isclose(h.log_prob, a.log_prob, abs_tol=1e-5)


def test_sampling_top_k_one_equals_greedy_and_temperature_matters():
    model = TinyLM().eval()
    with torch.no_grad():
        greedy = greedy_decode(model.step, prefixes(5), model.start(5), 10, EOS)
        top1 = sample(model.step, prefixes(5), model.start(5), 10, EOS, top_k=1,
                      generator=torch.Generator().manual_seed(0))
        a, b = (sample(model.step, prefixes(50), model.start(50), 10, None, temperature=t,
                       generator=torch.Generator().manual_seed(1)) for t in (0.01, 5.0))
    assert torch.equal(greedy, top1)
    assert len({tuple(r) for r in a.tolist()}) < len({tuple(r) for r in b.tolist()})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cpu_generator_samples_a_gpu_model_like_the_cpu_model():
    # a CPU generator used to fail on CUDA probabilities inside torch.multinomial
    model = TinyLM().eval()
    with torch.no_grad():
        on_cpu, on_gpu = (sample(m.step, prefixes(4).to(d), m.start(4, d), 8, None,
                                 generator=torch.Generator().manual_seed(0))
                          for m, d in ((model, "cpu"), (TinyLM().eval().cuda(), "cuda")))
    assert on_gpu.device.type == "cuda" and torch.equal(on_cpu, on_gpu.cpu())


def test_decoding_rejects_bad_arguments():
    step = table_step(torch.zeros(V, V))
    with pytest.raises(ValueError, match="prefix"):
        greedy_decode(step, torch.zeros(3, dtype=torch.long), None, 5)
    with pytest.raises(ValueError, match="temperature"):
        sample(step, prefixes(1), None, 5, temperature=0.0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(step, prefixes(1), None, 5, EOS, beam_size=0)


def test_decoding_runs_on_meta():
    model = TinyLM().to("meta")
    prefix = torch.zeros(2, 1, dtype=torch.long, device="meta")
    out = greedy_decode(model.step, prefix, model.start(2, "meta"), 3)  # no eos: no sync
    assert out.shape == (2, 4) and out.device.type == "meta"
    out = sample(model.step, prefix, model.start(2, "meta"), 3, top_k=2)
    assert out.device.type == "meta"
