"""Taming the Transformer (notebook 14): a fixed-step training run that records what goes wrong,
and the diagnostics that explain it.

Every arm of the notebook's experiment gets the same number of optimizer steps and the same
batches (one seeded generator), and differs only in the block (post-LN, pre-LN, ReZero), the
optimizer (AdamW or RAdam) and the schedule (`utils.schedules.WarmupCosine` with or without a
linear warm-up). Besides the loss, each step records what the papers point at:

    grad_norm      ||g||, the global gradient norm before any clipping
    update_ratio   ||theta_{s+1} - theta_s|| / ||theta_s|| over all matrices: the relative size
                   of Adam's step (Z2H's update-to-data ratio), large when no warm-up tames it
    grad_qkv       (3,) the gradient norms of W_q, W_k, W_v, averaged over the blocks
                   (Liu et al. 2020: the query and key gradients are far smaller than the value's)
    grad_blocks    (L,) the gradient norm of each block's parameters (vanishing in lower blocks?)

Every run ends in one of three states, counted separately:

    nonfinite  the loss or a weight became inf or nan (a blow-up)
    failed     finite, but the final validation loss is above a threshold `fail_nats` (default
               `FAILED_NATS`, 3.0 nats): the model is stuck near the character-frequency level
               (the unigram cross-entropy of Tiny Shakespeare, about 3.35 nats); notebook 14
               measures its own threshold from the unigram and bigram baselines and passes it
    trained    neither
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from utils.attention import MultiHeadAttention
from utils.gpt import GPT, GPTConfig, evaluate_lm, lm_step
from utils.schedules import WarmupCosine
from utils.text import random_batches
from utils.train import decay_groups, fit

Tensor = torch.Tensor
FAILED_NATS = 3.0  # default threshold: a finite run whose final validation loss is above it "failed"
OPTIMIZERS = ("adamw", "radam")


def make_optimizer(model: nn.Module, name: str, lr: float, betas=(0.9, 0.98),
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """AdamW or RAdam, both with decoupled weight decay on matrices only (`utils.train.decay_groups`).

    The default `weight_decay=0` makes "adamw" plain Adam (and RAdam undecayed): notebook 14's
    arms differ only in the block, the optimizer's first steps and the schedule."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    groups = decay_groups(model, weight_decay)
    if name == "radam":
        return torch.optim.RAdam(groups, lr=lr, betas=betas, decoupled_weight_decay=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def qkv_grad_norms(model: nn.Module) -> list[float]:
    """[|dL/dW_q|, |dL/dW_k|, |dL/dW_v|], each averaged over the attention layers of `model`."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    out = []
    for name in ("W_q", "W_k", "W_v"):
        norms = [getattr(m, name).weight.grad for m in layers]
        out.append(sum(float(g.norm()) if g is not None else 0.0 for g in norms) / max(len(layers), 1))
    return out


def diagnostics(model: nn.Module):
    """The two `utils.train.fit` hooks that record, per update, what notebook 14 plots:
    `on_gradients` the Q/K/V and per-block gradient norms (and a copy of the matrices),
    `on_update` the relative size of the step just taken (`update_ratio`)."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    before: list[Tensor] = []

    def on_gradients(m: nn.Module) -> dict:
        before[:] = [p.detach().clone() for p in matrices]
        return {"grad_qkv": qkv_grad_norms(m), "grad_blocks": _block_norms(m)}

    def on_update(m: nn.Module) -> dict:
        return {"update_ratio": _relative_change(before, matrices)}

    return on_gradients, on_update


def _block_norms(model: nn.Module, param: str | None = None) -> list[float]:
    """|dL/dtheta_l| of each block l of a `GPT` (the gradients already computed); [] otherwise.
    All the block's parameters together, or only the one named `param` (e.g. "ffn.W_2.weight")."""
    blocks = model.blocks.blocks if isinstance(model, GPT) else []
    out = []
    for b in blocks:
        params = b.parameters() if param is None else [b.get_parameter(param)]
        out.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)))
    return out


@torch.no_grad()
def _relative_change(before: list[Tensor], after: list[Tensor]) -> float:
    num = sum(float((a - b).pow(2).sum()) for a, b in zip(after, before))
    den = sum(float(b.pow(2).sum()) for b in before)
    return math.sqrt(num / den)


INITS = ("gpt2", "xavier")


def xavier_init_(model: GPT) -> GPT:
    """Re-initialize every weight matrix inside the blocks with Xavier-uniform, the 2017
    Transformer's initialization (and `nn.Transformer`'s), in place of GPT-2's small one.
    Embeddings, layer norms, biases and ReZero's alphas keep their values."""
    for p in model.blocks.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model


def run_char_gpt(cfg: GPTConfig, train_ids: Tensor, val_ids: Tensor, steps: int, batch_size: int,
                 lr: float, warmup_steps: int = 0, optimizer: str = "adamw", seed: int = 0,
                 init: str = "gpt2", betas=(0.9, 0.98), min_lr_ratio: float = 0.1,
                 clip: float | None = None, device: torch.device | None = None,
                 fail_nats: float = FAILED_NATS) -> dict:
    """Build `GPT(cfg)` from `seed` (GPT-2's initialization, or `init="xavier"`: `xavier_init_`)
    on `device`, train it for `steps` updates on random windows of `train_ids` (N,) through
    `utils.train.fit` (`WarmupCosine`; no warm-up at 0; the gradient norm is logged, clipped only
    if `clip` is given), recording the `diagnostics`; stop early if the loss becomes non-finite.
    Returns the log plus "val_loss" (nats; nan for a blow-up), "nonfinite" (the loss or a weight
    became inf/nan), "failed" (finite, but final val loss above `fail_nats`) and the "model"."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    torch.manual_seed(seed)
    model = GPT(cfg)
    if init == "xavier":
        xavier_init_(model)
    model.to(device or train_ids.device)
    opt = make_optimizer(model, optimizer, lr, betas)
    batches = random_batches(train_ids, cfg.block_size, batch_size, torch.Generator().manual_seed(seed))
    on_gradients, on_update = diagnostics(model)
    log = fit(model, batches, lm_step, opt, updates=steps, clip=clip or math.inf,
              schedule=WarmupCosine(opt, warmup_steps, steps, min_lr_ratio),
              on_gradients=on_gradients, on_update=on_update, log_every=None)
    finite = math.isfinite(log["loss"][-1]) and all(torch.isfinite(p).all() for p in model.parameters())
    val = evaluate_lm(model, val_ids, batch_size=64) if finite else math.nan
    nonfinite = not math.isfinite(val)
    return {**log, "val_loss": val, "nonfinite": nonfinite, "failed": not nonfinite and val > fail_nats,
            "model": model}


# ---------------------------------------------------------------------------- diagnostics
def block_grad_norms(model: GPT, x: Tensor, y: Tensor, param: str | None = None) -> list[float]:
    """|dL/dtheta_l| for each block l on one batch x, y (B, T) (moved to the model's device): all
    the block's parameters together, or only the one named `param`, e.g. "ffn.W_2.weight" (the
    MLP's second matrix, the quantity of Xiong et al. 2020)."""
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    model(x.to(device), y.to(device))[1].backward()
    norms = _block_norms(model, param)
    model.zero_grad(set_to_none=True)
    return norms


def layer_norm_jacobian_norm(x: Tensor, eps: float = 1e-5) -> float:
    """Spectral norm of the Jacobian of LN(x) = (x - mean) / std (no gamma, beta) at x (E,).

    Xiong et al. (2020): it is O(sqrt(E) / ||x||); exactly sqrt(E) / ||x - mean|| for eps = 0.
    """
    if x.dim() != 1:
        raise ValueError(f"expected one position's vector (E,), got shape {tuple(x.shape)}")
    J = torch.autograd.functional.jacobian(lambda v: F.layer_norm(v, v.shape, eps=eps), x)  # (E, E)
    return float(torch.linalg.matrix_norm(J, ord=2))


def radam_rectification(step: int, beta2: float) -> float:
    """RAdam's r_t at optimizer step t = `step` (1-based); 0 while rho_t <= 5 (PyTorch's rule),
    when RAdam takes plain momentum steps without the adaptive 1 / sqrt(v) term.

    rho_inf = 2 / (1 - beta2) - 1,  rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t),
    r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t)).
    """
    if step < 1:
        raise ValueError(f"optimizer steps count from 1, got {step}")
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * beta2 ** step / (1 - beta2 ** step)
    if rho_t <= 5:
        return 0.0
    return math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
