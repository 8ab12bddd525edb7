"""Tests of utils.attention.MultiHeadAttention against nn.MultiheadAttention and SDPA."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from utils.attention import MultiHeadAttention


def pair(E=8, nh=2, seed=0, bias=True):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(E, nh, batch_first=True, bias=bias).eval()
    if bias:  # torch starts the biases at 0, which would hide a bias-copy bug
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return MultiHeadAttention(E, nh, bias=bias).load_from_torch(ref).eval(), ref


def lengths_mask(lengths, S):
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # (B, S) True = real


def test_shapes_and_weights_sum_to_one():
    mha, _ = pair()
    x = torch.randn(3, 5, 8)
    out, w = mha(x, need_weights=True)
    assert out.shape == (3, 5, 8) and w.shape == (3, 2, 5, 5)
    assert torch.allclose(w.sum(-1), torch.ones(3, 2, 5), atol=1e-6)
    assert mha(x)[1] is None


@pytest.mark.parametrize("masked", [False, True])
def test_matches_torch_multihead_attention(masked):
    mha, ref = pair()
    q, kv = torch.randn(3, 4, 8), torch.randn(3, 6, 8)
    keep = lengths_mask([6, 3, 1], 6) if masked else None
    ours, w = mha(q, kv, key_mask=keep, need_weights=True)
    theirs, w_ref = ref(q, kv, kv, key_padding_mask=None if keep is None else ~keep,
                        need_weights=True, average_attn_weights=False)
    diff = max((ours - theirs).abs().max().item(), (w - w_ref).abs().max().item())
    print(f"ours vs nn.MultiheadAttention (masked={masked}): max |diff| = {diff:.1e}")
    assert diff < 1e-5


def test_causal_mask_matches_torch_and_blocks_the_future():
    mha, ref = pair()
    x = torch.randn(2, 5, 8)
    ours, _ = mha(x, causal=True)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch: True = not allowed
    theirs, _ = ref(x, x, x, attn_mask=future, need_weights=False)
    print(f"causal: max |diff| = {(ours - theirs).abs().max():.1e}")
    assert torch.allclose(ours, theirs, atol=1e-5)
    x2 = x.clone()
    x2[:, -1] += 1.0  # change the last token: earlier outputs must not move
    assert torch.allclose(mha(x2, causal=True)[0][:, :-1], ours[:, :-1], atol=1e-6)


def test_sdpa_path_equals_scratch_path():
    mha, _ = pair(bias=False)
    x, keep = torch.randn(2, 6, 8), lengths_mask([6, 2], 6)
    scratch = mha(x, key_mask=keep, causal=True)[0]
    mha.sdpa = True
    fused = mha(x, key_mask=keep, causal=True)[0]
    q, k, v = (mha.split_heads(W(x)) for W in (mha.W_q, mha.W_k, mha.W_v))  # (B, nh, T, hs)
    direct = mha.W_o(mha.merge_heads(F.scaled_dot_product_attention(q, k, v)))
    diff = (fused - scratch).abs().max().item()
    print(f"scratch vs F.scaled_dot_product_attention: max |diff| = {diff:.1e}")
    assert diff < 1e-5
    assert torch.allclose(mha(x)[0], direct, atol=1e-5)


def test_padded_keys_get_zero_weight_and_do_not_matter():
    mha, _ = pair()
    x, keep = torch.randn(2, 6, 8), lengths_mask([4, 2], 6)
    out, w = mha(x, key_mask=keep, need_weights=True)
    assert (w[~keep[:, None, None, :].expand_as(w)] == 0).all()
    x2 = x.clone()
    x2[~keep] = 100.0  # garbage in the padded positions
    out2 = mha(x2, key_mask=keep)[0]
    assert torch.allclose(out[keep], out2[keep], atol=1e-5)


def test_cached_causal_queries_see_all_earlier_keys():
    mha, _ = pair()
    x = torch.randn(1, 5, 8)
    full = mha(x, causal=True)[0]  # (1, 5, 8)
    last = mha(x[:, -1:], x, causal=True)[0]  # one new query against all 5 keys
    assert torch.allclose(full[:, -1:], last, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)
    mha, _ = pair()
    with pytest.raises(ValueError, match="key_mask"):
        mha(torch.randn(2, 4, 8), key_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="expected inputs"):
        mha(torch.randn(2, 4, 7))


REFUSED = {  # ours, the torch module, what the error must say
    "bias dropped": (dict(bias=False), dict(), "bias: nn.MultiheadAttention has True, ours has False"),
    "bias missing": (dict(), dict(bias=False), "bias: nn.MultiheadAttention has False, ours has True"),
    "add_bias_kv": (dict(), dict(add_bias_kv=True), "add_bias_kv: nn.MultiheadAttention has True"),
    "add_zero_attn": (dict(), dict(add_zero_attn=True), "add_zero_attn: nn.MultiheadAttention has True"),
    "heads": (dict(n_heads=4), dict(), "n_heads: nn.MultiheadAttention has 2, ours has 4"),
    "kdim": (dict(), dict(kdim=4, vdim=4), "kdim = vdim = d_model: nn.MultiheadAttention has False"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_load_from_torch_refuses_what_it_cannot_copy(case):
    # before: the biases were dropped silently (outputs off by ~1), the extra key/value row and
    # the zero attention ignored, and a bias-free module failed with a NoneType TypeError
    ours, theirs, message = REFUSED[case]
    mha = MultiHeadAttention(8, **{"n_heads": 2, **ours})
    with pytest.raises(ValueError, match=message):
        mha.load_from_torch(nn.MultiheadAttention(8, 2, batch_first=True, **theirs))


def test_bias_free_module_loads_into_a_bias_free_one():
    mha, ref = pair(bias=False)
    x = torch.randn(2, 5, 8)
    assert torch.allclose(mha(x)[0], ref(x, x, x)[0], atol=1e-6)


def test_tiny_overfit():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x, y = torch.randn(4, 5, 8), torch.randn(4, 5, 8)
    opt = torch.optim.Adam(mha.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        loss = F.mse_loss(mha(x)[0], y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_meta_device_forward():
    meta = torch.device("meta")
    for sdpa in (False, True):
        mha = MultiHeadAttention(8, 2, sdpa=sdpa).to(meta)
        x, keep = torch.randn(2, 5, 8, device=meta), torch.ones(2, 5, dtype=torch.bool, device=meta)
        out, w = mha(x, key_mask=keep, causal=True, need_weights=not sdpa)
        assert out.shape == (2, 5, 8) and out.device.type == "meta"
