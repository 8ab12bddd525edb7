"""Tests of utils.attention: score functions against direct formulas, masked softmax, pooling."""

import math

import pytest
import torch
import torch.nn.functional as F

from utils.attention import (
    SCORES,
    AdditiveScore,
    Attention,
    ConcatScore,
    GeneralScore,
    attention_pool,
    dot_score,
    gaussian_kernel_score,
    make_score,
    masked_softmax,
    nadaraya_watson,
    scaled_dot_score,
)


def qk(B=2, Tq=3, Tk=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, Tq, d, generator=g), torch.randn(B, Tk, d, generator=g)


def test_dot_and_scaled_dot_against_a_loop():
    q, k = qk()
    direct = torch.tensor([[[float(q[b, i] @ k[b, j]) for j in range(5)] for i in range(3)]
                           for b in range(2)])
    diff = (dot_score(q, k) - direct).abs().max().item()
    print(f"dot vs loop: max |diff| = {diff:.1e}")
    assert diff < 1e-5
    assert torch.allclose(scaled_dot_score(q, k), direct / 2.0, atol=1e-6)  # sqrt(4) = 2


def test_scaled_dot_attention_matches_torch_sdpa():
    q, k = qk(d=8)
    v = torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    ours, _ = Attention(make_score("scaled_dot", 8, 8))(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, :])
    diff = (ours - ref).abs().max().item()
    print(f"ours vs F.scaled_dot_product_attention: max |diff| = {diff:.1e}")
    assert diff < 1e-5


def test_general_score_is_the_bilinear_form():
    q, k = qk(d=4)
    k = torch.randn(2, 5, 6)
    score = GeneralScore(4, 6)
    direct = torch.einsum("bqd,de,bke->bqk", q, score.W, k)
    assert score(q, k).shape == (2, 3, 5)
    assert torch.allclose(score(q, k), direct, atol=1e-5)


def test_additive_score_against_a_loop_over_keys():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 6)
    score = AdditiveScore(4, 6, 7)
    out = score(q, k)  # (B, Tq, Tk)
    for j in range(5):  # one key at a time: w_v . tanh(W_q q + W_k k_j)
        direct = score.w_v(torch.tanh(score.W_q(q) + score.W_k(k[:, j:j + 1])))[..., 0]
        assert torch.allclose(out[:, :, j], direct, atol=1e-6)
    assert torch.allclose(score(q, k, keys_projected=score.project_keys(k)), out)


def test_concat_equals_additive_with_split_weights():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 6)
    concat, additive = ConcatScore(4, 6, 7), AdditiveScore(4, 6, 7)
    with torch.no_grad():
        additive.W_q.weight.copy_(concat.W.weight[:, :4])  # W [q; k] = W_q q + W_k k
        additive.W_k.weight.copy_(concat.W.weight[:, 4:])
        additive.w_v.weight.copy_(concat.w_v.weight)
    diff = (concat(q, k) - additive(q, k)).abs().max().item()
    print(f"concat vs additive: max |diff| = {diff:.1e}")
    assert diff < 1e-5


def test_masked_softmax_properties():
    scores = torch.randn(3, 2, 4)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True],
                         [False, False, False, False]])
    w = masked_softmax(scores, mask)
    assert torch.all(w[0, :, 2:] == 0.0) and torch.all(w[2] == 0.0)  # exactly zero
    assert not torch.isnan(w).any()
    assert torch.allclose(w[:2].sum(-1), torch.ones(2, 2))
    assert torch.allclose(w[1], torch.softmax(scores[1], -1))
    assert torch.allclose(masked_softmax(scores), torch.softmax(scores, -1))


def test_masked_softmax_gradient_of_fully_masked_row_is_finite():
    scores = torch.randn(1, 1, 3, requires_grad=True)
    masked_softmax(scores, torch.zeros(1, 3, dtype=torch.bool)).sum().backward()
    assert torch.isfinite(scores.grad).all()


def test_masked_softmax_rejects_bad_masks():
    with pytest.raises(TypeError, match="bool"):
        masked_softmax(torch.randn(2, 3, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\(B, Tk\) key mask, here \(2, 4\); got \(2, 5\)"):
        masked_softmax(torch.randn(2, 3, 4), torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        masked_softmax(torch.randn(2, 3, 4), torch.ones(2, 3, 5, dtype=torch.bool))


def test_masked_softmax_reads_a_2d_mask_as_a_key_mask_for_any_scores():
    # scores (B, nh, T, S) with B == T: a (B, S) key mask used to broadcast as a (T, S) mask
    torch.manual_seed(0)
    scores = torch.randn(3, 2, 3, 5)  # (B, nh, T, S)
    keep = torch.arange(5)[None, :] < torch.tensor([5, 2, 1])[:, None]  # (B, S)
    ref = masked_softmax(scores, keep[:, None, None, :])  # (B, 1, 1, S), spelled out
    assert torch.equal(masked_softmax(scores, keep), ref)
    assert torch.all(masked_softmax(scores, keep)[1, :, :, 2:] == 0)  # input 1 has 2 real keys
    three_d = masked_softmax(scores[:, 0], keep)  # (B, T, S): the same reading
    assert torch.equal(three_d, ref[:, 0])


def test_masked_softmax_takes_a_full_rank_mask_that_broadcasts():
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 4)  # (B, Tq, Tk)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()  # (Tq, Tk)
    w = masked_softmax(scores, causal[None])  # (1, Tq, Tk): one causal mask for the batch
    assert w.shape == scores.shape and torch.all(w.triu(1) == 0)
    assert torch.allclose(w, torch.softmax(scores.masked_fill(~causal, float("-inf")), -1))


def test_masked_softmax_refuses_masks_it_would_misread():
    scores = torch.randn(1, 4, 4)  # (B = 1, Tq, Tk)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()  # (Tq, Tk): not a (B, Tk) key mask
    with pytest.raises(ValueError, match=r"key mask.*mask\[None\]"):
        masked_softmax(scores, causal)  # used to return (4, 4, 4) weights
    with pytest.raises(ValueError, match="axes"):
        masked_softmax(scores, torch.ones(4, dtype=torch.bool))  # (Tk,): neither form
    with pytest.raises(ValueError, match="would change"):
        masked_softmax(scores, torch.ones(3, 4, 4, dtype=torch.bool))  # would grow the batch


def test_attention_pool_shapes_and_padding_is_ignored():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    ctx, w = Attention(make_score("dot", 4, 4))(q, k, v, mask)
    assert ctx.shape == (2, 3, 6) and w.shape == (2, 3, 5)
    v2 = v.clone()
    v2[1, 2:] = 1e3  # change the padded values: the output must not move
    assert torch.allclose(Attention(make_score("dot", 4, 4))(q, k, v2, mask)[0], ctx)
    assert torch.allclose(attention_pool(w, v), torch.einsum("bqk,bkd->bqd", w, v), atol=1e-6)


def test_gaussian_kernel_and_nadaraya_watson():
    x = torch.tensor([[0.0, 1.0, 2.0]])
    s = gaussian_kernel_score(torch.tensor([[1.0]]), x, sigma=1.0)
    assert torch.allclose(s, torch.tensor([[[-0.5, 0.0, -0.5]]]))
    y_hat, w = nadaraya_watson(torch.tensor([[1.0]]), x, torch.tensor([[3.0, 5.0, 7.0]]))
    assert torch.allclose(y_hat, torch.tensor([[5.0]]))  # symmetric weights around x = 1
    assert math.isclose(float(w.sum()), 1.0, rel_tol=1e-6)


@pytest.mark.parametrize("kind", SCORES)
def test_every_score_runs_on_meta(kind):
    score = make_score(kind, 8, 8, 6).to("meta")
    q, k, v = (torch.empty(2, 3, 8, device="meta"), torch.empty(2, 5, 8, device="meta"),
               torch.empty(2, 5, 8, device="meta"))
    mask = torch.ones(2, 5, dtype=torch.bool, device="meta")
    ctx, w = Attention(score)(q, k, v, mask)
    assert ctx.shape == (2, 3, 8) and w.shape == (2, 3, 5) and ctx.device.type == "meta"


def test_make_score_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown score"):
        make_score("cosine", 4, 4)


def test_tiny_attention_overfit():
    """A general score learns which key a teacher's bilinear form points each query at."""
    torch.manual_seed(0)
    q, k = torch.randn(8, 1, 4), torch.randn(8, 6, 4)
    target = (q @ (3 * torch.randn(4, 4)) @ k.transpose(1, 2))[:, 0].argmax(-1)  # (8,)
    score = GeneralScore(4, 4)
    opt = torch.optim.Adam(score.parameters(), lr=0.1)
    for _ in range(150):
        loss = F.cross_entropy(score(q, k)[:, 0], target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2


# ---------------------------------------------------------------------------- query spread
def test_query_spread_is_zero_for_columns_and_one_minus_1_over_t_for_a_permutation():
    from utils.attention import query_spread
    T = 5
    columns = torch.softmax(torch.randn(1, 1, 1, T), -1).expand(2, 3, T, T)  # every row the same
    reversal = torch.eye(T).flip(1)[None, None]  # query t on key T-1-t
    torch.testing.assert_close(query_spread(columns), torch.zeros(2, 3))
    torch.testing.assert_close(query_spread(reversal), torch.full((1, 1), 1 - 1 / T))


def test_query_spread_ignores_padded_queries():
    from utils.attention import query_spread
    T = 4
    w = torch.eye(T).flip(1)[None, None].repeat(2, 1, 1, 1)  # (2, 1, T, T)
    w[1, 0, 2:] = 1 / T  # rows of two padded queries: garbage that must not count
    mask = torch.tensor([[True] * T, [True, True, False, False]])
    spread = query_spread(w, mask)
    # the second map's two real rows put all weight on keys 3 and 2: each is 1/2 from their mean row
    torch.testing.assert_close(spread, torch.tensor([[1 - 1 / T], [0.5]]))


def test_query_spread_refuses_a_map_that_is_not_self_attention_or_a_wrong_mask():
    from utils.attention import query_spread
    with pytest.raises(ValueError, match=r"\(B, nh, T, T\)"):
        query_spread(torch.rand(2, 1, 3, 4))
    with pytest.raises(ValueError, match="True on real tokens"):
        query_spread(torch.rand(2, 1, 3, 3), torch.ones(2, 3))


def test_head_patterns_read_known_maps_and_ignore_padding():
    from utils.attention import head_patterns

    T, n = 6, 4  # sentence 0 has 4 real tokens, sentence 1 all 6
    mask = torch.tensor([[True] * n + [False] * (T - n), [True] * T])
    prev = torch.zeros(2, T, T)
    prev[:, 0, 0] = 1.0
    prev[:, torch.arange(1, T), torch.arange(T - 1)] = 1.0  # every query on the token before it
    uniform = torch.zeros(2, T, T)
    uniform[0, :, :n] = 1 / n
    uniform[1] = 1 / T
    layer = torch.stack([prev, uniform], 1)  # (B, nh = 2, T, T)
    layer[0, :, n:] = 9.0  # padded queries: must not count
    scores = head_patterns([layer, layer], mask)
    assert set(scores) == {"previous", "next", "itself", "frame", "spread"}
    assert all(v.shape == (2, 2) for v in scores.values())
    assert torch.allclose(scores["previous"][:, 0], torch.ones(2))
    assert torch.allclose(scores["next"][:, 0], torch.zeros(2))
    uniform_prev = ((n - 1) / n + (T - 1) / T) / (n - 1 + T - 1)  # mean of 1/n and 1/T over queries
    assert torch.allclose(scores["previous"][0, 1], torch.tensor(uniform_prev))
    spread = (n * math.log2(n) + T * math.log2(T)) / (n + T)
    assert torch.allclose(scores["spread"][0, 1], torch.tensor(spread), atol=1e-6)
    assert torch.allclose(scores["spread"][0, 0], torch.zeros(()), atol=1e-6)
