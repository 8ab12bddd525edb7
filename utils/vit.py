"""The Vision Transformer (ViT, Dosovitskiy et al. 2021), built from the course's encoder blocks.

An image is cut into N = (H / p) (W / p) square patches of p x p pixels; each patch, flattened
to C p^2 numbers, is a "token". With patch embedding W_p (C p^2 -> E), a class token x_cls (E,)
and a learned position table P (N + 1, E):

    z_0 = [x_cls; x_1 W_p; ...; x_N W_p] + P           (B, N + 1, E)   then dropout
    z_l = Block_l(z_{l-1}),  l = 1..L                  pre-LN encoder blocks (notebook 08), GELU
    logits = LN(z_L)[:, 0] W_head                      (B, n_classes): read at the class token

The blocks are `utils.transformer.Encoder` blocks without any mask: every patch sees every
patch. `load_from_hf` copies a Hugging Face `ViTForImageClassification` (or `ViTModel`), so a
test can prove that this is exactly the ViT. `SmallCNN` is the convolutional baseline, and
`train_classifier` the recipe both share (AdamW, warm-up + cosine, light augmentation).

Shapes: B batch, C channels, H x W pixels, p patch size, N patches, T = N + 1 tokens,
E = d_model, nh heads, L layers, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from utils.loading import check_same
from utils.schedules import WarmupCosine, WarmupStableDecay
from utils.train import adamw, autocast, fit, model_device, no_gain_for, param_count  # noqa: F401 (param_count: re-exported for notebook 13)
from utils.transformer import (
    HF_ACTIVATIONS,
    Encoder,
    EncoderConfig,
    LearnedPositions,
    fuse_layer_norms_,
)

Tensor = torch.Tensor


# ---------------------------------------------------------------------------- patches
def img_to_patch(x: Tensor, patch_size: int, flatten_channels: bool = True) -> Tensor:
    """Images (B, C, H, W) -> patches (B, N, C p^2), row by row (raster order), N = H/p * W/p.

    Each patch vector lists its channels, then its rows, then its columns (C, p, p): the order
    in which a (E, C, p, p) convolution kernel flattens, so a linear layer on these vectors and
    a stride-p convolution compute the same thing. `flatten_channels=False` keeps each patch
    as a small image: (B, N, C, p, p).
    """
    if x.dim() != 4:
        raise ValueError(f"expected images (B, C, H, W), got shape {tuple(x.shape)}")
    B, C, H, W = x.shape
    p = patch_size
    if H % p or W % p:
        raise ValueError(f"image size {H}x{W} is not divisible by patch_size={p}: pad or crop "
                         "the images, or pick a patch size that divides both sides")
    x = x.reshape(B, C, H // p, p, W // p, p)  # (B, C, H/p, p, W/p, p)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p): patch grid first
    x = x.flatten(1, 2)  # (B, N, C, p, p), patches in raster order
    return x.flatten(2, 4) if flatten_channels else x  # (B, N, C p^2)


def patch_to_img(patches: Tensor, patch_size: int, channels: int, height: int, width: int) -> Tensor:
    """The inverse of `img_to_patch`: patches (B, N, C p^2) -> images (B, C, H, W)."""
    B, N, D = patches.shape
    p = patch_size
    if N != (height // p) * (width // p) or D != channels * p * p:
        raise ValueError(f"patches {tuple(patches.shape)} do not tile a {channels}x{height}x{width} "
                         f"image with patch_size={p}")
    x = patches.reshape(B, height // p, width // p, channels, p, p)  # (B, H/p, W/p, C, p, p)
    x = x.permute(0, 3, 1, 4, 2, 5)  # (B, C, H/p, p, W/p, p)
    return x.reshape(B, channels, height, width)  # (B, C, H, W)


# ---------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ViTConfig:
    """Sizes of a Vision Transformer; defaults are a small model for 28x28 grey images."""

    image_size: int = 28  # H = W, pixels per side
    patch_size: int = 4  # p; N = (image_size / p)^2 patches (49 for 28 / 4)
    in_channels: int = 1  # C (1 for grey images, 3 for RGB)
    n_classes: int = 10  # K
    d_model: int = 64  # E, the width of every token
    n_heads: int = 4  # nh; each head works in hs = E / nh dimensions
    n_layers: int = 4  # L, encoder blocks
    d_ff: int | None = None  # F, the MLP width; None: 2 E (the paper uses 4 E on large data)
    dropout: float = 0.1  # on embeddings + positions, the MLP hidden layer and sublayer outputs
    attn_dropout: float | None = 0.0  # on attention weights; None: the same as `dropout`
    activation: str = "gelu"  # exact GELU, as in the paper and Hugging Face's ViT
    eps: float = 1e-6  # layer norm epsilon (the paper's; Hugging Face's ViTConfig uses 1e-12)
    sdpa: bool = True  # fused attention whenever no weights are asked for
    fused_norm: bool = True  # layer norm through F.layer_norm (same function, one fused kernel)

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not divisible by "
                             f"patch_size={self.patch_size}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def encoder_config(self) -> EncoderConfig:
        return EncoderConfig(d_model=self.d_model, n_heads=self.n_heads,
                             d_ff=self.d_ff or 2 * self.d_model, n_layers=self.n_layers,
                             dropout=self.dropout, attn_dropout=self.attn_dropout, norm_first=True,
                             activation=self.activation, eps=self.eps, sdpa=self.sdpa)


class VisionTransformer(nn.Module):
    """Patches -> linear embedding -> [CLS] + positions -> pre-LN encoder -> head on [CLS].

    forward: images (B, C, H, W) -> logits (B, K); with `need_weights=True` also the per-block
    attention maps, a list of L tensors (B, nh, T, T) with T = N + 1 (token 0 is [CLS]).
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        E, p = cfg.d_model, cfg.patch_size
        self.patch_embed = nn.Linear(cfg.in_channels * p * p, E)  # W_p (C p^2 -> E)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, E))  # x_cls, one learned token
        self.pos = LearnedPositions(E, cfg.n_patches + 1)  # P (N + 1, E), row 0 for [CLS]
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(cfg.encoder_config())  # pre-LN blocks + the final layer norm
        self.head = nn.Linear(E, cfg.n_classes)  # (E -> K)
        if cfg.fused_norm:
            fuse_layer_norms_(self)
        self.apply(_init_vit)
        nn.init.normal_(self.cls_token, std=0.02)

    def features(self, images: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """images (B, C, H, W) -> (tokens after the final norm (B, T, E), attention maps)."""
        c = self.cfg
        if images.dim() != 4 or images.shape[1:] != (c.in_channels, c.image_size, c.image_size):
            raise ValueError(f"expected images (B, {c.in_channels}, {c.image_size}, {c.image_size}), "
                             f"got {tuple(images.shape)}")
        B = images.shape[0]
        x = self.patch_embed(img_to_patch(images, c.patch_size))  # (B, N, E)
        cls = self.cls_token.expand(B, -1, -1)  # (B, 1, E), the same token for every image
        x = self.drop(self.pos(torch.cat([cls, x], dim=1)))  # (B, T, E), T = N + 1
        return self.encoder(x, need_weights=need_weights)  # (B, T, E), [(B, nh, T, T)] * L

    def forward(self, images: Tensor, need_weights: bool = False):
        x, maps = self.features(images, need_weights)  # (B, T, E)
        logits = self.head(x[:, 0])  # (B, K): only the [CLS] token is read
        return (logits, maps) if need_weights else logits


def _init_vit(module: nn.Module) -> None:
    """Truncated-normal(0.02) weights and zero biases for linear layers (the ViT/timm recipe)."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# ---------------------------------------------------------------------------- reference: HF ViT
@torch.no_grad()
def load_from_hf(model: VisionTransformer, hf, ignore: tuple[str, ...] = ()) -> VisionTransformer:
    """Copy a Hugging Face `ViTForImageClassification` (or a bare `ViTModel`) into `model`.

    Hugging Face embeds patches with a `Conv2d(C, E, kernel=p, stride=p)`: its kernel (E, C, p, p)
    flattened to (E, C p^2) is our `patch_embed` weight. Its position table is (1, T, E), its
    class token (1, 1, E); each layer keeps query, key and value as separate linear layers, and
    the classifier reads the class token after the final layer norm, as ours does.
    A ViT configured otherwise (sizes, heads, activation, epsilon, ...) is refused; `ignore`
    names fields not to compare, for a near miss.
    """
    check_same(type(hf).__name__, vit_fields(model.cfg), hf_vit_fields(hf, model.cfg), ignore)
    vit = getattr(hf, "vit", hf)  # ViTForImageClassification wraps a ViTModel as .vit
    emb = vit.embeddings
    model.patch_embed.weight.copy_(emb.patch_embeddings.projection.weight.flatten(1))  # (E, C p^2)
    model.patch_embed.bias.copy_(emb.patch_embeddings.projection.bias)
    model.cls_token.copy_(emb.cls_token)  # (1, 1, E)
    model.pos.P.weight.copy_(emb.position_embeddings[0])  # (T, E)
    layers = vit.layers if hasattr(vit, "layers") else vit.encoder.layer  # transformers 5 / 4
    for ours, layer in zip(model.encoder.blocks, layers):
        q, k, v, o, fc1, fc2 = _hf_linears(layer)
        pairs = ((ours.attn.W_q, q), (ours.attn.W_k, k), (ours.attn.W_v, v), (ours.attn.W_o, o),
                 (ours.ffn.W_1, fc1), (ours.ffn.W_2, fc2))
        for lin, theirs in pairs:
            lin.weight.copy_(theirs.weight)
            lin.bias.copy_(theirs.bias)
        ours.norm1.load_from_torch(layer.layernorm_before)
        ours.norm2.load_from_torch(layer.layernorm_after)
    model.encoder.norm.load_from_torch(vit.layernorm)
    if hasattr(hf, "classifier"):
        model.head.weight.copy_(hf.classifier.weight)
        model.head.bias.copy_(hf.classifier.bias)
    return model


def vit_fields(cfg: ViTConfig) -> dict:
    """What `load_from_hf` compares: every field of ours that changes the function."""
    return {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "d_ff": cfg.d_ff or 2 * cfg.d_model, "activation": cfg.activation, "eps": cfg.eps,
            "patch_size": cfg.patch_size, "image_size": cfg.image_size,
            "in_channels": cfg.in_channels, "qkv_bias": True, "n_classes": cfg.n_classes}


def hf_vit_fields(hf, cfg: ViTConfig) -> dict:
    """The same fields of a Hugging Face ViT (a bare `ViTModel` has no classes to compare)."""
    c = hf.config
    return {"d_model": c.hidden_size, "n_layers": c.num_hidden_layers,
            "n_heads": c.num_attention_heads, "d_ff": c.intermediate_size,
            "activation": HF_ACTIVATIONS.get(c.hidden_act, c.hidden_act),
            "eps": c.layer_norm_eps, "patch_size": c.patch_size, "image_size": c.image_size,
            "in_channels": c.num_channels, "qkv_bias": c.qkv_bias,
            "n_classes": c.num_labels if hasattr(hf, "classifier") else cfg.n_classes}


def _hf_linears(layer) -> tuple[nn.Linear, ...]:
    """W_q, W_k, W_v, W_o, W_1, W_2 of one Hugging Face `ViTLayer`, whose names changed in
    transformers 5 (attention.q_proj, mlp.fc1) from 4 (attention.attention.query, intermediate.dense)."""
    att = layer.attention
    if hasattr(att, "q_proj"):
        return att.q_proj, att.k_proj, att.v_proj, att.o_proj, layer.mlp.fc1, layer.mlp.fc2
    return (att.attention.query, att.attention.key, att.attention.value, att.output.dense,
            layer.intermediate.dense, layer.output.dense)


# ---------------------------------------------------------------------------- what it learned
def position_similarity(model: VisionTransformer) -> Tensor:
    """Cosine similarity of the patch position embeddings: (N, N), [CLS] left out."""
    P = F.normalize(model.pos.P.weight[1:].detach().float(), dim=-1)  # (N, E), unit rows
    return P @ P.T  # (N, N)


def attention_rollout(maps: list[Tensor], residual: bool = True) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): how much each token draws on each input token.

    maps: L tensors (B, nh, T, T). Per layer, average the heads and (with `residual`) add the
    identity for the skip connection, renormalize rows, then multiply the layers:
    R = A_L ... A_2 A_1 (B, T, T). Row 0 of R is the class token's mix of input patches.
    """
    R = None
    for w in maps:
        A = w.float().mean(1)  # (B, T, T), heads averaged
        if residual:
            A = A + torch.eye(A.shape[-1], device=A.device)  # (B, T, T): the skip keeps x itself
            A = A / A.sum(-1, keepdim=True)  # rows sum to 1 again
        R = A if R is None else A @ R  # (B, T, T)
    return R


# ---------------------------------------------------------------------------- the CNN baseline
class SmallCNN(nn.Module):
    """The convolutional baseline: three [conv 3x3 -> BN -> ReLU (x2) -> max-pool] stages, a head.

    Convolutions see 3x3 neighbourhoods and share weights across positions: the locality and
    translation-equivariance a ViT has to learn from data. images (B, C, H, W) -> logits (B, K).
    The very first convolution steps `stem_stride` pixels (2: 28x28 images become 14x14 maps at
    once). That keeps every parameter and cuts the arithmetic about 4.4-fold for notebook 13's
    widths (3.7M instead of 16.4M multiply-adds per image): a stride-1 CNN spends most of its
    work on the full-resolution first stage. `stem_stride=1` is the plain VGG-style stack.
    """

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128), in_channels: int = 1,
                 n_classes: int = 10, dropout: float = 0.1, stem_stride: int = 2) -> None:
        super().__init__()
        layers, c = [], in_channels
        for i, w in enumerate(widths):
            stride = stem_stride if i == 0 else 1
            layers += [nn.Conv2d(c, w, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                       nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                       nn.MaxPool2d(2)]
            c = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout),
                                  nn.Linear(c, n_classes))
        self.to(memory_format=torch.channels_last)  # kernels stored (out, kh, kw, in): see forward

    def forward(self, images: Tensor) -> Tensor:
        # Same numbers in another memory layout: channels-last (B, H, W, C) storage makes the
        # convolutions about a quarter cheaper on a CPU (and suits GPU tensor cores).
        x = images.contiguous(memory_format=torch.channels_last)  # (B, C, H, W), stored (B, H, W, C)
        return self.head(self.features(x))  # (B, c, h, w) -> (B, K)


# ---------------------------------------------------------------------------- data and training
def to_tensor(images, mean: float = 0.2860, std: float = 0.3530) -> Tensor:
    """uint8 images (N, H, W) -> float (N, 1, H, W), standardized with the Fashion-MNIST
    training-set mean and std (of pixels scaled to [0, 1])."""
    x = torch.tensor(images, dtype=torch.float32)[:, None] / 255.0  # (N, 1, H, W), a copy
    return (x - mean) / std


def augment(x: Tensor, pad: int = 1, flip: bool = True, generator: torch.Generator | None = None) -> Tensor:
    """Random crop after padding by `pad` pixels (a shift of up to `pad` pixels each way) and a
    horizontal flip with probability 1/2; x (B, C, H, W) -> (B, C, H, W), one draw per image.

    The padding value is the batch minimum (the background), not 0: the inputs are standardized.
    Fashion-MNIST garments are centred, so small shifts are the useful ones: for the ViT of
    notebook 13, shifts of up to 1 pixel train better than the usual 2 (section 5 measures it).
    """
    B, C, H, W = x.shape
    g = generator
    if pad:
        xp = F.pad(x, (pad, pad, pad, pad), value=float(x.min()))  # (B, C, H + 2 pad, W + 2 pad)
        dy = torch.randint(0, 2 * pad + 1, (B, 1), generator=g).to(x.device)  # (B, 1) shifts
        dx = torch.randint(0, 2 * pad + 1, (B, 1), generator=g).to(x.device)
        rows = (dy + torch.arange(H, device=x.device))[:, :, None]  # (B, H, 1)
        cols = (dx + torch.arange(W, device=x.device))[:, None, :]  # (B, 1, W)
        b = torch.arange(B, device=x.device)[:, None, None]  # (B, 1, 1)
        x = xp.permute(0, 2, 3, 1)[b, rows, cols].permute(0, 3, 1, 2)  # (B, C, H, W)
    if flip:
        mirror = (torch.rand(B, generator=g) < 0.5).to(x.device)[:, None, None, None]  # (B, 1, 1, 1)
        x = torch.where(mirror, x.flip(-1), x)  # (B, C, H, W)
    return x


@torch.no_grad()
def classify(model: nn.Module, x: Tensor, batch_size: int = 1000, precision: str = "fp32") -> Tensor:
    """The predicted class of every image x (N, C, H, W) -> (N,) on the CPU (batches go to the
    model's device), e.g. to compare two models image by image (`utils.metrics.paired_difference`)."""
    model.eval()
    device, out = model_device(model), []
    for i in range(0, len(x), batch_size):
        with autocast(model, precision):
            out.append(model(x[i:i + batch_size].to(device)).argmax(-1).cpu())  # (b,)
    return torch.cat(out)


def evaluate_classifier(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 1000,
                        precision: str = "fp32") -> float:
    """Accuracy of `model` on images x (N, C, H, W) with labels y (N,) (batches go to its device)."""
    return int((classify(model, x, batch_size, precision) == y.cpu()).sum()) / len(y)


def shuffled_batches(x: Tensor, y: Tensor, batch_size: int, generator: torch.Generator):
    """Endless minibatches (x_b, y_b): a fresh permutation every epoch, a last short batch dropped."""
    order = torch.empty(0, dtype=torch.long)
    while True:
        if len(order) < batch_size:  # a new epoch
            order = torch.randperm(len(y), generator=generator)
        idx, order = order[:batch_size], order[batch_size:]
        yield x[idx], y[idx]  # (B, C, H, W), (B,)


def train_classifier(model: nn.Module, x: Tensor, y: Tensor, updates: int, batch_size: int = 128,
                     lr: float = 2e-3, weight_decay: float = 0.05, warmup_steps: int = 100,
                     pad: int = 1, seconds: float | None = None, precision: str = "fp32", seed: int = 0,
                     eval_every: int | None = None, x_val: Tensor | None = None,
                     y_val: Tensor | None = None, patience: int | None = None,
                     log_every: int | None = None) -> dict:
    """The recipe the ViT and the CNN share, through `utils.train.fit`: AdamW on shuffled
    batches (epoch after epoch), linear warm-up then cosine decay to 0 over `updates`
    (`utils.schedules.WarmupCosine`), gradients clipped at 1, and augmentation: shifts of up to
    `pad` pixels and horizontal flips (`augment`; pad=0: none). AdamW runs fused where the
    device has the kernel (`utils.train.adamw`).

    x (N, C, H, W), y (N,). `seconds` caps the training time (a safety net: the cosine follows
    the updates). Every `eval_every` updates and at the end, the accuracy on (x_val, y_val) is
    logged as "val_acc". `patience`: early stopping that ends at a low rate. The schedule is then
    warm-up, the peak rate held, and a linear decay to 0 (`WarmupStableDecay`): the decay starts
    once `patience` validations in a row have not beaten the best one (at the latest at
    updates / 1.2), lasts a fifth of the updates before it, and ends the run; the best validated
    weights are restored. Returns `fit`'s log, with "epochs" = passes over the training images
    (with `patience` also "best_update" and "decay_start").
    """
    if patience is not None and (x_val is None or not eval_every):
        raise ValueError("early stopping (patience) needs validation images (x_val, y_val) and eval_every")
    g, B = torch.Generator().manual_seed(seed), min(batch_size, len(y))
    opt = adamw(model, lr, weight_decay, fused=True)  # one kernel per tensor: cheaper on a CPU

    def step(m: nn.Module, batch) -> dict:
        xb, yb = batch  # (B, C, H, W), (B,)
        xb = augment(xb, pad, generator=g) if pad else xb  # the same generator as the shuffles
        return {"loss": F.cross_entropy(m(xb).float(), yb), "n": len(yb)}  # float32 loss

    validate = None if x_val is None else (lambda m: {"acc": evaluate_classifier(m, x_val, y_val)})
    if patience is None:  # a fixed budget: warm-up and cosine over `updates`
        schedule, stop_when = WarmupCosine(opt, warmup_steps, updates), None
    else:  # early stopping: hold the rate while validation improves, then decay and stop
        schedule, stalled = WarmupStableDecay(opt, warmup_steps, updates, 0.2, eval_every), no_gain_for(patience)

        def stop_when(stats: dict) -> bool:
            if stalled(stats):
                schedule.start_decay()
            return schedule.done
    log = fit(model, shuffled_batches(x, y, B, g), step, opt, updates=updates, seconds=seconds,
              schedule=schedule, clip=1.0, precision=precision, validate=validate,
              eval_every=eval_every, log_every=log_every, stop_when=stop_when,
              keep_best=None if patience is None else ("val_acc", "max"))
    if patience is not None:
        log["decay_start"] = schedule.decay_start
    return {**log, "epochs": log["updates"] * B / len(y)}
