"""Greedy decoding, beam search with length normalization, and sampling, written once.

Every autoregressive model of the course (the recurrent encoder-decoders of notebook 07, the
Transformer of 09, the GPT of 10) exposes the same small interface:

    step(prefix, state) -> (log_probs, new_state)

- prefix (B, t) int64: the tokens so far (a start token, or a prompt, then what was generated);
  a recurrent model reads only prefix[:, -1], a Transformer reads all of it;
- state: anything the model carries between steps (a hidden state, the encoder memory and its
  mask, a key/value cache, or None), as a tensor or a (nested) tuple/list/dict of tensors
  whose first axis is the batch. `select_state` reorders and expands it for beams, so a model
  never writes beam code itself;
- log_probs (B, V): log-probabilities of the next token.

Nothing here creates a tensor on a fixed device: everything follows `prefix.device`.
`greedy_decode` and `sample` also run on PyTorch's `meta` device (a test checks it);
`beam_search` reads the finished beams' scores back to Python, so it needs real numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Tensor = torch.Tensor
State = object  # a tensor, None, or a nested tuple/list/dict of tensors with batch first
StepFn = Callable[[Tensor, State], tuple[Tensor, State]]


def select_state(state: State, index: Tensor) -> State:
    """Pick rows `index` (1-D int64) of every tensor in `state` along its batch axis (axis 0)."""
    if state is None:
        return None
    if torch.is_tensor(state):
        return state.index_select(0, index)
    if isinstance(state, dict):
        return {key: select_state(value, index) for key, value in state.items()}
    if isinstance(state, (tuple, list)):
        return type(state)(select_state(value, index) for value in state)
    raise TypeError(f"cannot select beams from a state of type {type(state).__name__}: use "
                    "tensors, tuples, lists or dicts of tensors with the batch first")


def _check_prefix(prefix: Tensor, max_len: int) -> None:
    if prefix.dim() != 2 or prefix.dtype != torch.long:
        raise ValueError(f"prefix must be (B, t) int64 token ids, got {tuple(prefix.shape)} "
                         f"{prefix.dtype}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")


def _generate(step: StepFn, prefix: Tensor, state: State, max_len: int, eos_id: int | None,
              pad_id: int, choose: Callable[[Tensor], Tensor]) -> Tensor:
    """The loop greedy decoding and sampling share; `choose` maps log_probs (B, V) to ids (B,)."""
    _check_prefix(prefix, max_len)
    tokens = prefix
    done = torch.zeros(prefix.shape[0], dtype=torch.bool, device=prefix.device)  # (B,)
    for _ in range(max_len):
        log_probs, state = step(tokens, state)  # (B, V)
        next_id = choose(log_probs)  # (B,)
        next_id = next_id.masked_fill(done, pad_id)  # finished rows only pad
        tokens = torch.cat([tokens, next_id[:, None]], dim=1)  # (B, t + 1)
        if eos_id is not None:
            done = done | (next_id == eos_id)
            if bool(done.all()):
                break
    return tokens


def greedy_decode(step: StepFn, prefix: Tensor, state: State, max_len: int,
                  eos_id: int | None = None, pad_id: int = 0) -> Tensor:
    """Take the most probable token at every step: prefix (B, t) -> tokens (B, t + n), n <= max_len.

    Rows that produced `eos_id` are padded with `pad_id` while the others continue.
    """
    return _generate(step, prefix, state, max_len, eos_id, pad_id,
                     lambda log_probs: log_probs.argmax(dim=-1))


def sample(step: StepFn, prefix: Tensor, state: State, max_len: int,
           eos_id: int | None = None, pad_id: int = 0, temperature: float = 1.0,
           top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Draw each token from softmax(log_probs / temperature), optionally from the top k only.

    temperature < 1 sharpens the distribution, > 1 flattens it; top_k = 1 is greedy decoding.
    prefix (B, t) -> tokens (B, t + n).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature} (use greedy_decode)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")

    def choose(log_probs: Tensor) -> Tensor:
        logits = log_probs.float() / temperature  # (B, V)
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))  # keep the k best
        probs = torch.softmax(logits, dim=-1)  # (B, V)
        # draw where the generator lives (a CPU generator seeds a GPU model's samples too)
        where = generator.device if generator is not None else probs.device
        return torch.multinomial(probs.to(where), 1, generator=generator)[:, 0].to(probs.device)  # (B,)

    return _generate(step, prefix, state, max_len, eos_id, pad_id, choose)


# ---------------------------------------------------------------------------- beam search
@dataclass(frozen=True)
class Hypothesis:
    """A finished beam: generated tokens (eos included if produced) and its scores."""

    tokens: list[int]  # without the prefix
    log_prob: float  # sum of the token log-probabilities
    score: float  # log_prob / len(tokens) ** alpha, what beams are ranked by


def length_normalize(log_prob: float, length: int, alpha: float) -> float:
    """log p / length^alpha: alpha = 0 keeps the raw sum (which favours short outputs),
    alpha = 1 is the mean log-probability per token."""
    return log_prob / max(length, 1) ** alpha


def beam_search(step: StepFn, prefix: Tensor, state: State, max_len: int, eos_id: int,
                beam_size: int = 5, alpha: float = 1.0) -> list[list[Hypothesis]]:
    """Beam search for a batch of B inputs at once; returns, per input, its finished
    hypotheses sorted by length-normalized score, best first.

    Each input keeps `beam_size` live beams (rows of one (B * K, ...) batch). A beam that emits
    `eos_id` among the K best candidates is finished and scored with `length_normalize`; the
    live beams are the K best candidates that did not end. An input stops once it has K
    finished hypotheses; at `max_len` its live beams are finished as they are.
    With beam_size = 1 this is exactly greedy decoding.
    """
    _check_prefix(prefix, max_len)
    B, K, device = prefix.shape[0], beam_size, prefix.device
    if K < 1:
        raise ValueError(f"beam_size must be at least 1, got {K}")
    rows = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,)
    tokens, state = prefix.index_select(0, rows), select_state(state, rows)  # (B*K, t)
    scores = torch.full((B, K), float("-inf"), device=device)  # (B, K)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first one
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    t0 = prefix.shape[1]
    for _ in range(max_len):
        log_probs, state = step(tokens, state)  # (B*K, V)
        V = log_probs.shape[-1]
        total = scores[:, :, None] + log_probs.float().view(B, K, V)  # (B, K, V)
        top, flat = total.view(B, K * V).topk(min(2 * K, K * V), dim=-1)  # (B, 2K)
        beam, token = flat // V, flat % V  # (B, 2K) each
        ended = token == eos_id  # (B, 2K)
        _collect(finished, top, beam, token, ended, tokens, t0, K)
        # the K best candidates that go on: rank the non-eos ones first, keep their order
        order = (ended.float() * 2 * K + torch.arange(top.shape[1], device=device)).argsort(dim=-1)
        keep = order[:, :K]  # (B, K)
        scores = top.gather(1, keep).masked_fill(ended.gather(1, keep), float("-inf"))  # (B, K)
        parent = (torch.arange(B, device=device)[:, None] * K + beam.gather(1, keep)).view(-1)  # (B*K,)
        tokens = torch.cat([tokens.index_select(0, parent), token.gather(1, keep).view(-1, 1)],
                           dim=1)  # (B*K, t + 1)
        state = select_state(state, parent)
        if all(len(f) >= K for f in finished):
            break
    _finish_live(finished, scores, tokens, t0, K, alpha)
    return [sorted(f, key=lambda h: h.score, reverse=True)[:K] for f in finished]


def _collect(finished, top, beam, token, ended, tokens, t0, K) -> None:
    """Move the eos candidates that rank among the K best into `finished` (alpha set later)."""
    for b, j in ended[:, :K].nonzero().tolist():  # only eos among the K best counts
        if len(finished[b]) >= K or top[b, j].item() == float("-inf"):
            continue
        prev = tokens[b * K + beam[b, j].item(), t0:].tolist()
        finished[b].append(Hypothesis(prev + [int(token[b, j])], float(top[b, j]), float("nan")))


def _finish_live(finished, scores, tokens, t0, K, alpha) -> None:
    """Score every finished hypothesis; inputs short of K also get their live beams."""
    for b in range(len(finished)):
        for k in range(K):
            if len(finished[b]) < K and scores[b, k].item() > float("-inf"):
                finished[b].append(Hypothesis(tokens[b * K + k, t0:].tolist(),
                                              float(scores[b, k]), float("nan")))
        finished[b] = [Hypothesis(h.tokens, h.log_prob,
                                  length_normalize(h.log_prob, len(h.tokens), alpha))
                       for h in finished[b]]
