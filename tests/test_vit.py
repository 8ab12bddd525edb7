"""Tests of utils.vit: patches, the patch embedding as a convolution, HF ViT equivalence, training."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import randomize_

from utils.vit import (
    SmallCNN,
    VisionTransformer,
    ViTConfig,
    attention_rollout,
    augment,
    classify,
    evaluate_classifier,
    img_to_patch,
    load_from_hf,
    param_count,
    patch_to_img,
    position_similarity,
    train_classifier,
)

TINY = ViTConfig(image_size=8, patch_size=4, in_channels=2, n_classes=3, d_model=16, n_heads=2,
                 n_layers=2, dropout=0.0)


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return VisionTransformer(ViTConfig(**{**TINY.__dict__, **kw})).eval()


def test_img_to_patch_round_trip_and_layout():
    x = torch.randn(2, 3, 8, 12)
    patches = img_to_patch(x, 4)
    assert patches.shape == (2, 6, 3 * 16)  # 2 x 3 grid of 4x4 patches
    assert torch.equal(patch_to_img(patches, 4, 3, 8, 12), x)
    grid = img_to_patch(x, 4, flatten_channels=False)  # (B, N, C, p, p)
    assert torch.equal(grid[:, 4], x[:, :, 4:8, 4:8])  # patch 4 = second row, second column
    with pytest.raises(ValueError, match="not divisible by patch_size=5"):
        img_to_patch(x, 5)


def test_linear_patch_embedding_equals_strided_convolution():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    conv = torch.nn.Conv2d(3, 5, kernel_size=4, stride=4)
    lin = torch.nn.Linear(3 * 16, 5)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.flatten(1))  # (E, C, p, p) -> (E, C p^2)
        lin.bias.copy_(conv.bias)
    a = lin(img_to_patch(x, 4))  # (B, N, E)
    b = conv(x).flatten(2).transpose(1, 2)  # (B, E, 2, 2) -> (B, N, E)
    diff = (a - b).abs().max().item()
    print(f"linear patch embedding vs strided conv: max |diff| = {diff:.1e}")
    assert diff < 1e-5


def test_shapes_weights_and_bad_input():
    model = tiny()
    x = torch.randn(3, 2, 8, 8)
    logits, maps = model(x, need_weights=True)
    assert logits.shape == (3, 3) and len(maps) == 2 and maps[0].shape == (3, 2, 5, 5)
    assert torch.allclose(maps[0].sum(-1), torch.ones(3, 2, 5))
    assert torch.allclose(model(x), logits, atol=1e-6)  # sdpa path = explicit weights path
    R = attention_rollout(maps)
    assert R.shape == (3, 5, 5) and torch.allclose(R.sum(-1), torch.ones(3, 5), atol=1e-5)
    assert position_similarity(model).shape == (4, 4)
    with pytest.raises(ValueError, match=r"expected images \(B, 2, 8, 8\)"):
        model(torch.randn(3, 2, 12, 12))
    with pytest.raises(ValueError, match="not divisible"):
        ViTConfig(image_size=28, patch_size=5)


def test_meta_device_forward():
    with torch.device("meta"):
        model = VisionTransformer(TINY)
        cnn = SmallCNN((4, 8), in_channels=2, n_classes=3)
    x = torch.empty(2, 2, 8, 8, device="meta")
    assert model(x).shape == (2, 3) and model(x).device.type == "meta"
    logits, maps = model(x, need_weights=True)
    assert attention_rollout(maps).device.type == "meta"
    assert cnn(x).shape == (2, 3)


@pytest.fixture(scope="module")
def transformers():
    """Imported once (a few seconds, paid at setup); the test skips without the package."""
    transformers = pytest.importorskip("transformers")
    transformers.ViTForImageClassification  # noqa: B018 (the lazy module loads on first access)
    return transformers


def test_matches_hugging_face_vit_with_copied_weights(transformers):
    hc = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=2, hidden_size=16,
                                num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                num_labels=3)
    torch.manual_seed(1)
    hf = randomize_(transformers.ViTForImageClassification(hc).eval())
    x = torch.randn(2, 2, 8, 8)
    for sdpa in (False, True):
        ours = load_from_hf(tiny(sdpa=sdpa, eps=hc.layer_norm_eps), hf)
        with torch.no_grad():
            diff = (ours(x) - hf(pixel_values=x).logits).abs().max().item()
            hidden = hf.vit(pixel_values=x).last_hidden_state
            diff_h = (ours.features(x)[0] - hidden).abs().max().item()
        print(f"ViT vs ViTForImageClassification (sdpa={sdpa}): logits {diff:.1e}, tokens {diff_h:.1e}")
        assert diff < 1e-4 and diff_h < 1e-4
    with pytest.raises(ValueError, match="d_model: ViTForImageClassification has 16, ours has 8"):
        load_from_hf(tiny(d_model=8), hf)


VIT_MISMATCHES = {  # a change to the tiny HF config or to ours, what the error says
    "heads": (dict(num_attention_heads=4), {}, "n_heads: {} has 4, ours has 2"),
    "activation": (dict(hidden_act="relu"), {}, "activation: {} has 'relu', ours has 'gelu'"),
    "tanh gelu": ({}, dict(activation="gelu_tanh"), "activation: {} has 'gelu', ours has 'gelu_tanh'"),
    "eps": ({}, dict(eps=1e-6), "eps: {} has 1e-12, ours has 1e-06"),
    "d_ff": (dict(intermediate_size=48), {}, "d_ff: {} has 48, ours has 32"),
    "qkv_bias": (dict(qkv_bias=False), {}, "qkv_bias: {} has False, ours has True"),
    "patch": ({}, dict(patch_size=2), "patch_size: {} has 4, ours has 2"),
    "classes": (dict(num_labels=5), {}, "n_classes: {} has 5, ours has 3"),
}


@pytest.mark.parametrize("case", VIT_MISMATCHES)
def test_load_from_hf_refuses_a_vit_configured_otherwise(transformers, case):
    # before: the head count was not compared (a 4-head ViT loaded into a 2-head one)
    theirs, ours, message = VIT_MISMATCHES[case]
    hc = transformers.ViTConfig(**{"image_size": 8, "patch_size": 4, "num_channels": 2,
                                   "hidden_size": 16, "num_hidden_layers": 2,
                                   "num_attention_heads": 2, "intermediate_size": 32,
                                   "num_labels": 3, **theirs})
    hf = transformers.ViTForImageClassification(hc).eval()
    with pytest.raises(ValueError, match=message.format("ViTForImageClassification")):
        load_from_hf(tiny(**{"eps": 1e-12, "d_ff": 32, **ours}), hf)


def test_augment_keeps_shape_and_shifts():
    x = torch.arange(16.0).view(1, 1, 4, 4).repeat(8, 1, 1, 1)
    g = torch.Generator().manual_seed(0)
    y = augment(x, pad=1, flip=False, generator=g)
    assert y.shape == x.shape
    assert not all(torch.equal(y[i], x[i]) for i in range(8))  # some images moved
    assert torch.equal(augment(x, pad=0, flip=False), x)


def test_train_classifier_passes_its_shift_to_augment(monkeypatch):
    import utils.vit

    pads = []
    monkeypatch.setattr(utils.vit, "augment", lambda x, pad, generator=None: pads.append(pad) or x)
    x, y = torch.randn(8, 2, 8, 8), torch.arange(8) % 3
    train_classifier(tiny(), x, y, 3, batch_size=4, warmup_steps=1, pad=3)
    assert pads == [3, 3, 3]  # notebook 13's recipe sets the shift; it must reach every update


@pytest.mark.parametrize("make", ["vit", "cnn"])
def test_tiny_seeded_overfit(make):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, 8, 8, generator=g)
    y = torch.arange(12) % 3
    torch.manual_seed(0)
    model = tiny() if make == "vit" else SmallCNN((16, 32), in_channels=2, n_classes=3, dropout=0.0)
    log = train_classifier(model, x, y, 60, batch_size=12, lr=1e-2, warmup_steps=5,
                           weight_decay=0.0, pad=0)
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y).item()
    assert log["loss"][0] > 0.9 and log["loss"][-1] < 0.05, log["loss"][::10]
    assert loss < 0.5  # in eval mode too (the CNN's batch norm then uses running statistics)
    assert param_count(model) > 0


def test_a_seconds_cap_ends_training_and_the_final_model_is_validated():
    x, y = torch.randn(16, 2, 8, 8), torch.arange(16) % 3
    log = train_classifier(tiny(), x, y, 10**6, seconds=0.3, batch_size=8, warmup_steps=2,
                           eval_every=5, x_val=x, y_val=y)
    assert 0 < log["updates"] < 10**6 and 0.3 <= log["train_s"] < 1.0
    assert log["eval_update"][-1] == log["updates"] and log["epochs"] == log["updates"] * 8 / 16


def test_small_cnn_stores_channels_last_and_computes_the_same_function():
    torch.manual_seed(0)
    cnn = SmallCNN((4, 8), in_channels=2, n_classes=3).eval()
    assert cnn.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    plain = copy.deepcopy(cnn).to(memory_format=torch.contiguous_format)  # the usual (B, C, H, W) layout
    x = torch.randn(5, 2, 8, 8)
    with torch.no_grad():
        diff = (cnn(x) - plain.head(plain.features(x))).abs().max().item()
    print(f"channels-last CNN vs the same weights in the usual layout: max |diff| = {diff:.1e}")
    assert diff < 1e-5


def test_small_cnn_stem_stride_halves_the_first_maps_and_keeps_every_parameter():
    x = torch.randn(2, 1, 28, 28)
    strided, plain = SmallCNN((4, 8, 16)), SmallCNN((4, 8, 16), stem_stride=1)
    assert strided.features[0](x).shape[-2:] == (14, 14) and plain.features[0](x).shape[-2:] == (28, 28)
    assert param_count(strided) == param_count(plain)
    assert strided(x).shape == plain(x).shape == (2, 10)


def test_small_cnn_docstring_multiply_add_counts():
    """SmallCNN's docstring quotes 3.7M against 16.4M multiply-adds per image for notebook 13's widths."""
    def conv_macs(model):
        total = 0

        def count(conv, inputs, out):
            nonlocal total
            total += out[0].numel() * conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.register_forward_hook(count)
        model(torch.randn(1, 1, 28, 28))
        return total
    strided, plain = conv_macs(SmallCNN((24, 48, 96))), conv_macs(SmallCNN((24, 48, 96), stem_stride=1))
    assert round(strided / 1e6, 1) == 3.7 and round(plain / 1e6, 1) == 16.4 and round(plain / strided, 1) == 4.4


def test_early_stopping_decays_the_rate_after_patience_checks_then_ends_with_the_best_weights():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 2, 8, 8, generator=g), torch.arange(24) % 3
    xv, yv = torch.randn(12, 2, 8, 8, generator=g), torch.randint(0, 3, (12,), generator=g)  # noise: no gain
    torch.manual_seed(0)
    model = tiny()
    log = train_classifier(model, x, y, 400, batch_size=8, lr=1e-2, warmup_steps=2, pad=0,
                           eval_every=4, x_val=xv, y_val=yv, patience=3)
    stall = log["decay_start"]
    best_before = max(a for u, a in zip(log["eval_update"], log["val_acc"]) if u < stall)
    assert log["val_acc"][log["eval_update"].index(stall)] <= best_before  # stalled: 3 checks without a gain
    assert log["eval_update"].index(stall) - log["val_acc"].index(best_before) == 3
    decay = math.ceil(0.2 * stall / 4) * 4  # a fifth of the updates so far, whole validation intervals
    assert log["updates"] == stall + decay < 400
    assert log["lr"][stall] == pytest.approx(1e-2) and log["lr"][-1] == pytest.approx(1e-2 / decay)
    assert evaluate_classifier(model, xv, yv) == pytest.approx(max(log["val_acc"]))  # the best weights came back
    with pytest.raises(ValueError, match="needs validation images"):
        train_classifier(tiny(), x, y, 10, patience=2)


def test_classify_returns_the_predictions_that_evaluate_classifier_scores():
    torch.manual_seed(0)
    model, x = tiny(), torch.randn(10, 2, 8, 8)
    y = torch.arange(10) % 3
    pred = classify(model, x, batch_size=3)  # several batches
    with torch.no_grad():
        assert torch.equal(pred, model.eval()(x).argmax(-1))
    assert evaluate_classifier(model, x, y, batch_size=3) == (pred == y).sum().item() / 10
