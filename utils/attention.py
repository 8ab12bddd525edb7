"""Attention as pooling: score functions, masked softmax and the weighted sum of values.

Attention pools values v_i with weights that depend on how well a query q matches each key k_i:

    alpha(q, k_i) = softmax_i( a(q, k_i) ),     attention(q, K, V) = sum_i alpha(q, k_i) v_i

Everything is batch-first and batched over queries: q (B, Tq, d_q), K (B, Tk, d_k),
V (B, Tk, d_v); scores and weights are (B, Tq, Tk); the pooled output is (B, Tq, d_v).
A key mask is bool, True on real keys and False on padding, shaped (B, Tk); a mask that differs
per query has as many axes as the scores, e.g. (B, Tq, Tk) or (1, Tq, Tk) (see `masked_softmax`).

Score functions a(q, k) (notebook 07 derives each):
- Gaussian kernel  -(q - k)^2 / (2 sigma^2)       Nadaraya (1964), Watson (1964)
- dot              q . k                          Luong et al. (2015)
- scaled dot       q . k / sqrt(d)                Vaswani et al. (2017)
- general          q W k^T, a bilinear form       Luong et al. (2015)
- concat           w_v . tanh(W [q; k])           Luong et al. (2015)
- additive         w_v . tanh(q W_q + k W_k)      Bahdanau et al. (2015)
concat and additive are the same function (split W into its query and key columns); additive
never builds the (B, Tq, Tk, d_q + d_k) concatenation, and can project the keys once.
Multi-head attention (notebook 08) builds on `masked_softmax` and `scaled_dot_score`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from utils.loading import check_same

Tensor = torch.Tensor


# ---------------------------------------------------------------------------- masked softmax
def _check_mask(scores: Tensor, mask: Tensor) -> Tensor:
    """The mask with as many axes as the scores (..., Tk), or a ValueError that says why not."""
    if mask.dtype != torch.bool:
        raise TypeError(f"the mask must be bool (True = real key), got {mask.dtype}")
    shape, B, Tk = tuple(scores.shape), scores.shape[0], scores.shape[-1]
    if mask.dim() == 2 and scores.dim() > 2:  # a key mask: the same keys for every query
        if mask.shape[0] not in (1, B) or mask.shape[1] not in (1, Tk):
            raise ValueError(f"a 2-D mask is a (B, Tk) key mask, here ({B}, {Tk}); got "
                             f"{tuple(mask.shape)} for scores {shape}. For a (Tq, Tk) mask "
                             "shared by the whole batch (e.g. causal) pass mask[None]")
        mask = mask.view(mask.shape[0], *[1] * (scores.dim() - 2), mask.shape[1])  # (B, 1.., Tk)
    if mask.dim() != scores.dim():
        raise ValueError(f"mask {tuple(mask.shape)} for scores {shape}: pass a (B, Tk) key mask "
                         f"or a mask with as many axes as the scores ({scores.dim()})")
    try:
        grown = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError as err:
        raise ValueError(f"mask {tuple(mask.shape)} does not broadcast to scores {shape}: pass a "
                         "(B, Tk) key mask or a mask with size 1 or the scores' size on each axis"
                         ) from err
    if grown != scores.shape:
        raise ValueError(f"mask {tuple(mask.shape)} would change the scores' shape {shape} to "
                         f"{tuple(grown)}: its sizes must be 1 or the scores' sizes")
    return mask


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis that gives masked-out keys a weight of exactly 0.

    scores (..., Tk), e.g. (B, Tq, Tk) or (B, nh, Tq, Tk); mask bool, True on keys to keep:
    - (B, Tk), a key mask: the same keys for every query (and head), the padding of each input;
    - or a mask with as many axes as the scores, each of size 1 or the scores' size, e.g.
      (1, Tq, Tk) for one causal mask shared by the batch.
    A 2-D mask is always read as (B, Tk), unlike the `attn_mask` of
    `F.scaled_dot_product_attention`: a (Tq, Tk) mask must be passed as mask[None].
    A row with no real key at all (e.g. a padded query over an empty source) gets all zeros
    instead of the NaN that softmax over -inf everywhere would give.
    """
    if mask is not None:
        mask = _check_mask(scores, mask)
        scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)  # (..., 1): subtract the max for stability
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # fully masked row: max is -inf
    e = torch.exp(scores - m)  # (..., Tk); exp(-inf) = 0 exactly on masked keys
    total = e.sum(dim=-1, keepdim=True)  # (..., 1)
    return e / total.clamp_min(torch.finfo(e.dtype).tiny)  # 0 / tiny = 0 on empty rows


# ---------------------------------------------------------------------------- pooling
def attention_pool(weights: Tensor, values: Tensor) -> Tensor:
    """sum_i alpha_i v_i for every query, as one batched matrix product.

    weights (B, Tq, Tk), values (B, Tk, d_v) -> (B, Tq, d_v).
    """
    if weights.shape[-1] != values.shape[-2]:
        raise ValueError(f"weights have {weights.shape[-1]} keys but values have "
                         f"{values.shape[-2]} rows")
    return torch.bmm(weights, values)  # (B, Tq, d_v)


def gaussian_kernel_score(queries: Tensor, keys: Tensor, sigma: float = 1.0) -> Tensor:
    """Nadaraya-Watson scores -(q - k)^2 / (2 sigma^2): queries (B, Tq), keys (B, Tk) -> (B, Tq, Tk)."""
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    diff = queries[:, :, None] - keys[:, None, :]  # (B, Tq, Tk)
    return -diff**2 / (2 * sigma**2)  # (B, Tq, Tk)


def nadaraya_watson(queries: Tensor, keys: Tensor, values: Tensor, sigma: float = 1.0
                    ) -> tuple[Tensor, Tensor]:
    """Kernel regression f(q) = sum_i alpha(q, x_i) y_i with Gaussian-kernel weights.

    queries (B, Tq), keys x_i (B, Tk), values y_i (B, Tk) -> (predictions (B, Tq), weights (B, Tq, Tk)).
    """
    weights = masked_softmax(gaussian_kernel_score(queries, keys, sigma))  # (B, Tq, Tk)
    return attention_pool(weights, values[:, :, None])[..., 0], weights  # (B, Tq)


# ---------------------------------------------------------------------------- score functions
def _check_qk(queries: Tensor, keys: Tensor) -> None:
    if queries.dim() != 3 or keys.dim() != 3 or queries.shape[0] != keys.shape[0]:
        raise ValueError(f"expected queries (B, Tq, d_q) and keys (B, Tk, d_k), got "
                         f"{tuple(queries.shape)} and {tuple(keys.shape)}")


def dot_score(queries: Tensor, keys: Tensor) -> Tensor:
    """q . k for every pair: queries (B, Tq, d), keys (B, Tk, d) -> (B, Tq, Tk)."""
    _check_qk(queries, keys)
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(f"dot scores need d_q == d_k, got {queries.shape[-1]} and "
                         f"{keys.shape[-1]}: use the general or additive score instead")
    return torch.bmm(queries, keys.transpose(1, 2))  # (B, Tq, Tk)


def scaled_dot_score(queries: Tensor, keys: Tensor) -> Tensor:
    """q . k / sqrt(d): with unit-variance entries q . k has variance d; this brings it back to 1."""
    return dot_score(queries, keys) / math.sqrt(queries.shape[-1])  # (B, Tq, Tk)


class DotScore(nn.Module):
    """The parameter-free dot score as a module (optionally scaled by 1 / sqrt(d))."""

    def __init__(self, scaled: bool = False) -> None:
        super().__init__()
        self.scaled = scaled

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        return scaled_dot_score(queries, keys) if self.scaled else dot_score(queries, keys)


class GeneralScore(nn.Module):
    """Luong's general (bilinear) score q W k^T; W (d_q, d_k) lets q and k live in different spaces."""

    def __init__(self, d_q: int, d_k: int) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.empty(d_q, d_k).uniform_(-1, 1) / math.sqrt(d_q))  # (d_q, d_k)

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check_qk(queries, keys)
        return torch.bmm(queries @ self.W, keys.transpose(1, 2))  # (B, Tq, Tk)


class AdditiveScore(nn.Module):
    """Bahdanau's additive score w_v . tanh(q W_q + k W_k), an MLP with one hidden layer of d_a units.

    `project_keys` can be called once per source sentence (the keys do not change while the
    decoder runs); pass its result as `keys_projected` to skip that work at every step.
    """

    def __init__(self, d_q: int, d_k: int, d_a: int) -> None:
        super().__init__()
        self.W_q = nn.Linear(d_q, d_a, bias=False)
        self.W_k = nn.Linear(d_k, d_a, bias=False)
        self.w_v = nn.Linear(d_a, 1, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.W_k(keys)  # (B, Tk, d_a)

    def forward(self, queries: Tensor, keys: Tensor, keys_projected: Tensor | None = None
                ) -> Tensor:
        _check_qk(queries, keys)
        kp = self.project_keys(keys) if keys_projected is None else keys_projected  # (B, Tk, d_a)
        hidden = torch.tanh(self.W_q(queries)[:, :, None, :] + kp[:, None, :, :])  # (B, Tq, Tk, d_a)
        return self.w_v(hidden)[..., 0]  # (B, Tq, Tk)


class ConcatScore(nn.Module):
    """Luong's concat score w_v . tanh(W [q; k]), built literally from the concatenation.

    The same function as `AdditiveScore` (W = [W_q; W_k] stacked by rows); kept to show that,
    and why the additive form is the one to implement.
    """

    def __init__(self, d_q: int, d_k: int, d_a: int) -> None:
        super().__init__()
        self.W = nn.Linear(d_q + d_k, d_a, bias=False)
        self.w_v = nn.Linear(d_a, 1, bias=False)

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check_qk(queries, keys)
        (B, Tq, _), Tk = queries.shape, keys.shape[1]
        q = queries[:, :, None, :].expand(B, Tq, Tk, -1)  # (B, Tq, Tk, d_q)
        k = keys[:, None, :, :].expand(B, Tq, Tk, -1)  # (B, Tq, Tk, d_k)
        return self.w_v(torch.tanh(self.W(torch.cat([q, k], dim=-1))))[..., 0]  # (B, Tq, Tk)


SCORES = ("dot", "scaled_dot", "general", "concat", "additive")


def make_score(kind: str, d_q: int, d_k: int, d_a: int | None = None) -> nn.Module:
    """One of `SCORES` as a module; `d_a` is the hidden width of the concat/additive MLP."""
    if kind in ("dot", "scaled_dot"):
        return DotScore(scaled=kind == "scaled_dot")
    if kind == "general":
        return GeneralScore(d_q, d_k)
    if kind in ("concat", "additive"):
        d_a = d_a or d_k
        return ConcatScore(d_q, d_k, d_a) if kind == "concat" else AdditiveScore(d_q, d_k, d_a)
    raise ValueError(f"unknown score {kind!r}; choose one of {SCORES}")


class Attention(nn.Module):
    """Score, masked softmax, pool: (queries, keys, values, key mask) -> (context, weights).

    queries (B, Tq, d_q), keys (B, Tk, d_k), values (B, Tk, d_v), mask (B, Tk) bool or None
    -> context (B, Tq, d_v), weights (B, Tq, Tk). The weights are returned, never stored on
    the module, so a plot asks for them explicitly.
    """

    def __init__(self, score: nn.Module) -> None:
        super().__init__()
        self.score = score

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor,
                mask: Tensor | None = None, **score_kwargs) -> tuple[Tensor, Tensor]:
        weights = masked_softmax(self.score(queries, keys, **score_kwargs), mask)  # (B, Tq, Tk)
        return attention_pool(weights, values), weights  # (B, Tq, d_v), (B, Tq, Tk)


# ---------------------------------------------------------------------------- multi-head attention
class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017), built on `masked_softmax`.

    Q = x_q W_q, K = x_kv W_k, V = x_kv W_v, each (B, ., E) split into nh heads of hs = E / nh:
        head_h = softmax(Q_h K_h^T / sqrt(hs) + mask) V_h            (B, T, hs) for each h
        MHA(x_q, x_kv) = concat(head_1, ..., head_nh) W_o            (B, T, E)
    Self-attention passes x_q = x_kv = x; cross-attention (notebook 10) passes the encoder
    output as x_kv. Masks act on the scores, before the softmax: `key_mask` (B, S) bool is
    True on real keys (note: `nn.MultiheadAttention`'s key_padding_mask is the opposite, True
    on padding), `causal=True` lets query t see keys up to t only. The weights (B, nh, T, S)
    are returned on request (`need_weights=True`), never stored on the module.
    `sdpa=True` computes the same thing with `F.scaled_dot_product_attention` (fused, faster)
    whenever the weights are not requested. `load_from_torch` copies `nn.MultiheadAttention`.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 sdpa: bool = False) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}: "
                             "every head gets d_model / n_heads features")
        self.d_model, self.n_heads, self.hs = d_model, n_heads, d_model // n_heads
        self.dropout, self.sdpa = dropout, sdpa
        self.W_q = nn.Linear(d_model, d_model, bias=bias)  # all heads' queries at once
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)  # mixes the concatenated heads

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, E) -> (B, nh, T, hs): feature block h becomes head h."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.hs).transpose(1, 2)  # (B, nh, T, hs)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, nh, T, hs) -> (B, T, E): the concatenation of the heads."""
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, E)

    def score_mask(self, T: int, S: int, key_mask: Tensor | None, causal: bool,
                   device) -> Tensor | None:
        """Bool mask (B or 1, 1, T, S), True where query t may look at key s; None if all may."""
        keep = None
        if key_mask is not None:
            if key_mask.dtype != torch.bool or key_mask.dim() != 2 or key_mask.shape[1] != S:
                raise ValueError(f"key_mask must be bool (B, S={S}), True on real keys; got "
                                 f"{key_mask.dtype} {tuple(key_mask.shape)}")
            keep = key_mask[:, None, None, :]  # (B, 1, 1, S)
        if causal:  # with S > T (cached keys) query t sits at position S - T + t
            tri = torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)  # (T, S)
            keep = tri[None, None] if keep is None else keep & tri  # (B or 1, 1, T, S)
        return keep

    def attend(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None,
               need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Scaled dot-product attention per head: q (B, nh, T, hs), k, v (B, nh, S, hs)."""
        p = self.dropout if self.training else 0.0
        if self.sdpa and not need_weights:
            return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p), None
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hs)  # (B, nh, T, S)
        weights = masked_softmax(scores, keep)  # (B, nh, T, S), 0 on masked keys
        out = nn.functional.dropout(weights, p, self.training) @ v  # (B, nh, T, hs)
        return out, (weights if need_weights else None)

    def forward(self, x_q: Tensor, x_kv: Tensor | None = None, key_mask: Tensor | None = None,
                causal: bool = False, need_weights: bool = False, cache: dict | None = None,
                static_kv: bool = False) -> tuple[Tensor, Tensor | None]:
        """x_q (B, T, E), x_kv (B, S, E) (default: x_q) -> (out (B, T, E), weights (B, nh, T, S) or None).

        `cache` (notebook 10) is a dict that this call reads and updates in place:
        - self-attention while decoding (static_kv=False): the keys and values of the tokens
          seen so far, cache["k"], cache["v"] (B, nh, S_past, hs); the new ones are appended, so
          x_q holds only the new token(s) and the step costs O(S) instead of recomputing O(S^2).
          With `causal=True` the new queries sit at positions S_past, S_past + 1, ...
        - cross-attention (static_kv=True): the projected encoder memory, computed on the first
          call and reused at every later step (x_kv is then not needed).
        """
        if x_q.dim() != 3 or x_q.shape[-1] != self.d_model:
            raise ValueError(f"expected inputs (B, T, {self.d_model}), got queries {tuple(x_q.shape)}")
        T = x_q.shape[1]
        q = self.split_heads(self.W_q(x_q))  # (B, nh, T, hs)
        if cache is not None and static_kv and "k" in cache:
            k, v = cache["k"], cache["v"]  # (B, nh, S, hs): the memory, projected once
        else:
            x_kv = x_q if x_kv is None else x_kv
            if x_kv.dim() != 3 or x_kv.shape[-1] != self.d_model:
                raise ValueError(f"expected inputs (B, S, {self.d_model}), got keys/values "
                                 f"{tuple(x_kv.shape)}")
            k = self.split_heads(self.W_k(x_kv))  # (B, nh, S, hs)
            v = self.split_heads(self.W_v(x_kv))  # (B, nh, S, hs)
            if cache is not None:
                if not static_kv and "k" in cache:  # the key/value cache: append along S
                    k = torch.cat([cache["k"], k], dim=2)  # (B, nh, S_past + T, hs)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        keep = self.score_mask(T, k.shape[2], key_mask, causal, x_q.device)
        out, weights = self.attend(q, k, v, keep, need_weights)  # (B, nh, T, hs)
        return self.W_o(self.merge_heads(out)), weights  # (B, T, E)

    @torch.no_grad()
    def load_from_torch(self, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy `nn.MultiheadAttention` (batch_first or not): in_proj stacks W_q, W_k, W_v by rows.

        Refuses a module whose configuration differs (heads, biases, add_bias_kv, ...): the copy
        would compute another function.
        """
        ours = {"d_model": self.d_model, "n_heads": self.n_heads, "bias": self.W_q.bias is not None,
                "add_bias_kv": False, "add_zero_attn": False, "kdim = vdim = d_model": True}
        check_same("nn.MultiheadAttention", ours, {
            "d_model": mha.embed_dim, "n_heads": mha.num_heads,
            "bias": mha.in_proj_bias is not None, "add_bias_kv": mha.bias_k is not None,
            "add_zero_attn": mha.add_zero_attn, "kdim = vdim = d_model": mha._qkv_same_embed_dim})
        E = self.d_model
        for i, W in enumerate((self.W_q, self.W_k, self.W_v)):
            W.weight.copy_(mha.in_proj_weight[i * E:(i + 1) * E])  # (E, E), rows = outputs
            if W.bias is not None:
                W.bias.copy_(mha.in_proj_bias[i * E:(i + 1) * E])
        self.W_o.weight.copy_(mha.out_proj.weight)
        if self.W_o.bias is not None:
            self.W_o.bias.copy_(mha.out_proj.bias)
        return self


# ---------------------------------------------------------------------------- reading a map
def query_spread(weights: Tensor, mask: Tensor | None = None) -> Tensor:
    """How much *where* a query looks depends on *which* query it is (notebooks 08 and 09).

    For every real query row of a self-attention map, the total-variation distance to the map's
    mean row, 1/2 sum_s |a_ts - mean_t' a_t's|, averaged over the real queries. weights
    (B, nh, T, T); mask (B, T), True on real tokens (None: all real) -> (B, nh). 0 when every
    query looks at the same keys (a map of columns: pooling; a uniform map too), 1 - 1/T for a
    permutation (every query on its own key).
    """
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be a self-attention map (B, nh, T, T), got {tuple(weights.shape)}")
    B, T = weights.shape[0], weights.shape[-1]
    if mask is None:
        mask = torch.ones(B, T, dtype=torch.bool, device=weights.device)
    elif mask.dtype != torch.bool or tuple(mask.shape) != (B, T):
        raise ValueError(f"mask must be bool (B, T) = {(B, T)}, True on real tokens; got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    m = mask.to(weights.dtype)[:, None, :, None]  # (B, 1, T, 1): which rows are real queries
    mean_row = (weights * m).sum(2, keepdim=True) / m.sum(2, keepdim=True)  # (B, nh, 1, T)
    tv = 0.5 * (weights - mean_row).abs().sum(-1, keepdim=True)  # (B, nh, T, 1)
    return ((tv * m).sum(2) / m.sum(2)).squeeze(-1)  # (B, nh)


def head_patterns(maps: list[Tensor], key_mask: Tensor) -> dict[str, Tensor]:
    """What each head of an encoder looks at, averaged over every real query of a batch
    (notebook 12 picks the heads it shows by these numbers).

    maps: one self-attention map (B, nh, T, T) per layer; key_mask (B, T), True on real tokens,
    padding at the end of each row, whose first and last real tokens frame it ([CLS], [SEP]).
    -> {pattern: (L, nh)}: the mean weight a query gives to the token before it ("previous"),
    after it ("next"), to itself ("itself") and to the frame ("frame": first + last token), and
    the mean entropy of a query's weights in bits ("spread": 0 on one key, log2 n spread evenly
    over n keys). Padded queries and keys are left out.
    """
    A = torch.stack([m.detach().float().cpu() for m in maps])  # (L, B, nh, T, T)
    parts: dict[str, list[Tensor]] = {k: [] for k in ("previous", "next", "itself", "frame", "spread")}
    for b, n in enumerate(key_mask.sum(1).tolist()):
        a, i = A[:, b, :, :n, :n], torch.arange(n)  # (L, nh, n, n): real queries and keys only
        parts["previous"].append(a[..., i[1:], i[:-1]])  # (L, nh, n - 1)
        parts["next"].append(a[..., i[:-1], i[1:]])  # (L, nh, n - 1)
        parts["itself"].append(a[..., i, i])  # (L, nh, n)
        parts["frame"].append(a[..., 0] + a[..., n - 1])  # (L, nh, n)
        parts["spread"].append(-(a * a.clamp_min(1e-12).log2()).sum(-1))  # (L, nh, n)
    return {k: torch.cat(v, -1).mean(-1) for k, v in parts.items()}  # (L, nh) each
