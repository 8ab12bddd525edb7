"""Tests of utils.transformer (positions, layer norm, FFN, encoder) and the IMDB TransformerClassifier."""

import pytest
import torch
import torch.nn.functional as F
from helpers import keep_mask, randomize_
from torch import nn

from utils.classifiers import TransformerClassifier, TransformerClassifierConfig
from utils.transformer import (
    Encoder,
    EncoderBlock,
    EncoderConfig,
    FeedForward,
    LayerNorm,
    LearnedPositions,
    SinusoidalPositions,
    block_param_count,
    shift_matrix,
    sinusoidal_encoding,
)

SMALL = EncoderConfig(d_model=8, n_heads=2, d_ff=16, n_layers=2, dropout=0.0)


def test_layer_norm_matches_torch():
    ref = randomize_(nn.LayerNorm(8))
    ours = LayerNorm(8).load_from_torch(ref)
    x = torch.randn(3, 5, 8) * 4 + 2
    diff = (ours(x) - ref(x)).abs().max().item()
    print(f"LayerNorm vs nn.LayerNorm: max |diff| = {diff:.1e}")
    assert diff < 1e-5


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_matches_torch_layer_with_padding_mask(norm_first):
    torch.manual_seed(0)
    ref = randomize_(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                norm_first=norm_first)).eval()
    cfg = EncoderConfig(d_model=8, n_heads=2, d_ff=16, dropout=0.0, norm_first=norm_first)
    ours = EncoderBlock(cfg).load_from_torch(ref).eval()
    x, keep = torch.randn(3, 6, 8), keep_mask([6, 4, 1], 6)
    theirs = ref(x, src_key_padding_mask=~keep)
    mine, _ = ours(x, keep)
    diff = (mine[keep] - theirs[keep]).abs().max().item()
    print(f"EncoderBlock(norm_first={norm_first}) vs nn.TransformerEncoderLayer: max |diff| = {diff:.1e}")
    assert diff < 1e-5
    assert torch.allclose(ours(x)[0], ref(x), atol=1e-5)  # and without a mask


LAYER_MISMATCHES = {  # a change to nn.TransformerEncoderLayer(8, 2, 16), what the error says
    "activation": (dict(activation="gelu"), "activation: {} has 'gelu', ours has 'relu'"),
    "eps": (dict(layer_norm_eps=1e-6), "eps: {} has 1e-06, ours has 1e-05"),
    "bias": (dict(bias=False), "bias: {} has False, ours has True"),
    "norm_first": (dict(norm_first=True), "norm_first: {} has True, ours has False"),
    "heads": (dict(nhead=4), "n_heads: {} has 4, ours has 2"),
    "d_ff": (dict(dim_feedforward=32), "d_ff: {} has 32, ours has 16"),
}


@pytest.mark.parametrize("field", LAYER_MISMATCHES)
def test_encoder_block_refuses_a_layer_configured_otherwise(field):
    # before: a GELU layer loaded into a ReLU block without a word (outputs off by ~0.15)
    change, message = LAYER_MISMATCHES[field]
    ref = nn.TransformerEncoderLayer(**{"d_model": 8, "nhead": 2, "dim_feedforward": 16,
                                        "batch_first": True, **change})
    with pytest.raises(ValueError, match=message.format("nn.TransformerEncoderLayer")):
        EncoderBlock(EncoderConfig(d_model=8, n_heads=2, d_ff=16)).load_from_torch(ref)


@pytest.mark.parametrize("name, torch_activation", [("gelu", "gelu"), ("gelu", nn.GELU()),
                                                    ("gelu_tanh", nn.GELU(approximate="tanh")),
                                                    ("relu", nn.ReLU())])
def test_encoder_block_loads_each_activation_it_can_name(name, torch_activation):
    torch.manual_seed(0)
    ref = randomize_(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                activation=torch_activation)).eval()
    ours = EncoderBlock(EncoderConfig(8, 2, 16, dropout=0.0, activation=name))
    ours = ours.load_from_torch(ref).eval()
    x = torch.randn(2, 5, 8)
    assert torch.allclose(ours(x)[0], ref(x), atol=1e-5)


def test_layer_norm_refuses_another_epsilon():
    with pytest.raises(ValueError, match="eps: nn.LayerNorm has 1e-12, ours has 1e-05"):
        LayerNorm(8).load_from_torch(nn.LayerNorm(8, eps=1e-12))
    with pytest.raises(ValueError, match="elementwise_affine: nn.LayerNorm has False"):
        LayerNorm(8).load_from_torch(nn.LayerNorm(8, elementwise_affine=False))


def test_param_count_formula_matches_torch_and_textbook():
    layer = nn.TransformerEncoderLayer(512, 8, 2048)
    assert block_param_count(512, 8, 2048) == sum(p.numel() for p in layer.parameters()) == 3_152_384
    assert block_param_count(512, 8, 2048, qkvo_bias=False) == 3_150_336  # eq. 7.32
    assert sum(p.numel() for p in EncoderBlock(EncoderConfig()).parameters()) == 3_152_384


def test_sinusoidal_values_and_shift_matrix():
    pe = sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16)
    assert torch.allclose(pe[0, 0::2], torch.zeros(8)) and torch.allclose(pe[0, 1::2], torch.ones(8))
    assert torch.allclose(pe[7, 2], torch.sin(torch.tensor(7 / 10_000 ** (2 / 16))))
    for k in (1, 5, 13):
        M = shift_matrix(k, 16)
        assert torch.allclose(pe[:-k] @ M, pe[k:], atol=1e-4)  # one M for every position
        assert torch.allclose(M @ M.T, torch.eye(16), atol=1e-6)  # a rotation
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(4, 7)


def test_position_modules_add_and_offset():
    x = torch.zeros(2, 5, 8)
    sin = SinusoidalPositions(8, max_len=20)
    assert torch.allclose(sin(x)[0], sinusoidal_encoding(5, 8))
    assert torch.allclose(sin(x, start=3)[1], sinusoidal_encoding(8, 8)[3:])
    learned = LearnedPositions(8, max_len=10)
    assert torch.allclose(learned(x)[1], learned.P.weight[:5])
    with pytest.raises(ValueError, match="max_len"):
        learned(torch.zeros(1, 11, 8))


def test_self_attention_without_positions_is_permutation_equivariant():
    enc = randomize_(Encoder(SMALL)).eval()
    x, perm = torch.randn(2, 7, 8), torch.randperm(7, generator=torch.Generator().manual_seed(1))
    out = enc(x)[0]
    diff = (enc(x[:, perm])[0] - out[:, perm]).abs().max().item()
    print(f"encoder(permuted x) vs permuted encoder(x): max |diff| = {diff:.1e}")
    assert diff < 1e-5
    pos = SinusoidalPositions(8)
    assert not torch.allclose(enc(pos(x[:, perm]))[0], enc(pos(x))[0][:, perm], atol=1e-3)


def test_encoder_shapes_weights_and_final_norm():
    for norm_first in (False, True):
        cfg = EncoderConfig(d_model=8, n_heads=2, d_ff=16, n_layers=3, norm_first=norm_first)
        out, maps = Encoder(cfg)(torch.randn(2, 5, 8), keep_mask([5, 3], 5), need_weights=True)
        assert out.shape == (2, 5, 8) and len(maps) == 3 and maps[0].shape == (2, 2, 5, 5)
        assert isinstance(Encoder(cfg).norm, LayerNorm) == norm_first
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig(d_model=10, n_heads=4)


def tiny_classifier(**kw):
    torch.manual_seed(0)
    return TransformerClassifier(TransformerClassifierConfig(vocab_size=30, encoder=SMALL, **kw))


def test_classifier_shape_and_padding_invariance():
    tokens, lengths = torch.randint(1, 30, (3, 6)), torch.tensor([6, 4, 2])
    tokens[keep_mask([6, 4, 2], 6).logical_not()] = 0
    for pool in ("mean", "max"):
        model = tiny_classifier(pool=pool).eval()
        logits = model(tokens, lengths)
        more = model(F.pad(tokens, (0, 9)), lengths)  # nine more <pad> columns
        assert logits.shape == (3, 2)
        assert torch.allclose(logits, more, atol=1e-5)
    seed_model = tiny_classifier(pool="max", mask_padding=False, embed_norm=True).eval()
    assert not torch.allclose(seed_model(tokens, lengths), seed_model(F.pad(tokens, (0, 9)), lengths))


def test_classifier_attention_maps():
    model = tiny_classifier(positions="learned")
    maps = model.attention_maps(torch.randint(1, 30, (2, 5)), torch.tensor([5, 3]))
    assert len(maps) == 2 and maps[0].shape == (2, 2, 5, 5) and model.training
    assert (maps[0][1, :, :, 3:] == 0).all()  # padded keys of the second review


def test_classifier_tiny_overfit():
    model = tiny_classifier()
    tokens, lengths = torch.randint(1, 30, (8, 6)), torch.full((8,), 6)
    labels = torch.tensor([0, 1] * 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = F.cross_entropy(model(tokens, lengths), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_config_errors():
    with pytest.raises(ValueError, match="positions"):
        TransformerClassifierConfig(vocab_size=5, positions="rotary")
    with pytest.raises(ValueError, match="pool"):
        TransformerClassifierConfig(vocab_size=5, pool="cls")


def test_meta_device_forward_of_every_module():
    meta = torch.device("meta")
    x = torch.randn(2, 5, 8, device=meta)
    keep = torch.ones(2, 5, dtype=torch.bool, device=meta)
    for module in (LayerNorm(8), FeedForward(8, 16), SinusoidalPositions(8), LearnedPositions(8)):
        assert module.to(meta)(x).shape == (2, 5, 8)
    for norm_first in (False, True):
        cfg = EncoderConfig(d_model=8, n_heads=2, d_ff=16, n_layers=2, norm_first=norm_first)
        assert EncoderBlock(cfg).to(meta)(x, keep, need_weights=True)[0].shape == (2, 5, 8)
        assert Encoder(cfg).to(meta)(x, keep)[0].device.type == "meta"
    for pool in ("mean", "max"):
        model = tiny_classifier(pool=pool, positions="learned").to(meta)
        tokens = torch.zeros(2, 5, dtype=torch.long, device=meta)
        lengths = torch.ones(2, dtype=torch.long, device=meta)
        assert model(tokens, lengths).shape == (2, 2)


def test_fit_classifier_learns_and_keeps_best_weights():
    from utils.classifiers import accuracy, fit_classifier, make_loader

    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 30, (int(n),), generator=g).tolist() for n in torch.randint(2, 8, (64,))]
    labels = [int(x[0] < 16) for x in ids]  # the first token decides the label
    for x, y in zip(ids, labels):
        x[0] = 1 + y  # token 1 or 2
    model = tiny_classifier(positions="learned")
    val_dl = make_loader(ids, labels, 64, False)
    log = fit_classifier(model, make_loader(ids, labels, 16, True), 1e-2, epochs=15, warmup_steps=2,
                         val_dl=val_dl)
    assert log["updates"] == 60 and max(log["val_acc"]) > 0.9 and len(log["val_acc"]) == 15
    assert accuracy(model, val_dl) == max(log["val_acc"])  # the best epoch's weights are back


def test_make_positions_kinds():
    from utils.transformer import make_positions

    assert isinstance(make_positions("sinusoidal", 8, 16), SinusoidalPositions)
    assert isinstance(make_positions("learned", 8, 16), LearnedPositions)
    assert isinstance(make_positions("none", 8, 16), nn.Identity)
    with pytest.raises(ValueError, match="positions"):
        make_positions("rotary", 8, 16)
