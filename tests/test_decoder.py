"""Tests of the Transformer decoder (utils.transformer) and the key/value cache (utils.attention)."""

from dataclasses import replace

import pytest
import torch
from helpers import keep_mask, randomize_
from torch import nn

from utils.attention import MultiHeadAttention
from utils.decoding import beam_search, greedy_decode
from utils.transformer import (
    Decoder,
    DecoderBlock,
    DecoderConfig,
    TorchTransformer,
    Transformer,
    TransformerConfig,
    transformer_param_count,
)

TINY = TransformerConfig(src_vocab=23, tgt_vocab=23, d_model=16, n_heads=4, d_ff=32,
                         n_enc_layers=2, n_dec_layers=2, dropout=0.0, max_len=64)


def tiny_model(seed=0, cls=Transformer, **changes):
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{**TINY.__dict__, **changes})
    return cls(cfg).eval()


def batch(seed=1, B=3, S=7, T=6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 23, (B, S), generator=g)
    src_mask = keep_mask([S, 4, 2][:B], S)
    tgt = torch.randint(4, 23, (B, T), generator=g)
    return src.masked_fill(~src_mask, 0), src_mask, tgt


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_matches_torch_layer_with_masks(norm_first):
    torch.manual_seed(0)
    ref = randomize_(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                norm_first=norm_first)).eval()
    cfg = DecoderConfig(d_model=8, n_heads=2, d_ff=16, dropout=0.0, norm_first=norm_first)
    ours = DecoderBlock(cfg).load_from_torch(ref).eval()
    x, memory = torch.randn(3, 5, 8), torch.randn(3, 6, 8)
    mem_keep, tgt_keep = keep_mask([6, 3, 1], 6), keep_mask([5, 5, 3], 5)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True: may not attend
    theirs = ref(x, memory, tgt_mask=causal, tgt_key_padding_mask=~tgt_keep,
                 memory_key_padding_mask=~mem_keep)
    mine, _ = ours(x, memory, mem_keep, tgt_keep)
    diff = (mine[tgt_keep] - theirs[tgt_keep]).abs().max().item()
    print(f"DecoderBlock(norm_first={norm_first}) vs nn.TransformerDecoderLayer: max |diff| = {diff:.1e}")
    assert diff < 1e-5
    no_mask = ref(x, memory, tgt_mask=causal)
    assert torch.allclose(ours(x, memory)[0], no_mask, atol=1e-5)


def test_decoder_block_rejects_other_norm_placement():
    ref = nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, norm_first=True)
    with pytest.raises(ValueError, match="norm_first"):
        DecoderBlock(DecoderConfig(d_model=8, n_heads=2, d_ff=16)).load_from_torch(ref)


def test_decoder_block_refuses_another_activation():
    # before: only norm_first was compared; a GELU layer loaded into a ReLU block
    ref = nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, activation="gelu")
    ours = DecoderBlock(DecoderConfig(d_model=8, n_heads=2, d_ff=16))
    with pytest.raises(ValueError, match="activation: nn.TransformerDecoderLayer has 'gelu', ours has 'relu'"):
        ours.load_from_torch(ref)
    ref = nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, layer_norm_eps=1e-6)
    with pytest.raises(ValueError, match="eps: nn.TransformerDecoderLayer has 1e-06, ours has 1e-05"):
        ours.load_from_torch(ref)


def copy_torch_transformer(ref: TorchTransformer, ours: Transformer) -> Transformer:
    """Our Transformer with the weights of `ref` (pre-LN: both end each stack with a layer norm)."""
    ours.load_state_dict({k: v for k, v in ref.state_dict().items() if not k.startswith("core.")},
                         strict=False)
    for stack, theirs in ((ours.encoder, ref.core.encoder), (ours.decoder, ref.core.decoder)):
        for block, layer in zip(stack.blocks, theirs.layers):
            block.load_from_torch(layer)
        stack.norm.load_from_torch(theirs.norm)
    return ours


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_torch_reference_computes_our_transformer_with_copied_weights(activation):
    # before: TorchTransformer handed exact "gelu" to nn.Transformer for "gelu_tanh"
    # (logits 1.2e-4 apart in float64)
    ref = tiny_model(cls=TorchTransformer, norm_first=True, activation=activation).double()
    ours = tiny_model(seed=1, norm_first=True, activation=activation).double()
    ours = copy_torch_transformer(ref, ours)
    src, src_mask, tgt = batch()
    with torch.no_grad():
        diff = (ours(src, src_mask, tgt) - ref(src, src_mask, tgt)).abs().max().item()
    print(f"Transformer vs TorchTransformer ({activation}, float64): max |diff| = {diff:.1e}")
    assert diff < 1e-10


def test_decoder_stack_returns_weights_per_layer():
    dec = Decoder(DecoderConfig(d_model=8, n_heads=2, d_ff=16, n_layers=3, dropout=0.0)).eval()
    x, memory, keep = torch.randn(2, 4, 8), torch.randn(2, 5, 8), keep_mask([5, 2], 5)
    out, maps = dec(x, memory, keep, need_weights=True)
    assert out.shape == (2, 4, 8) and len(maps["self"]) == len(maps["cross"]) == 3
    assert maps["cross"][0].shape == (2, 2, 4, 5)
    assert maps["cross"][0][1, :, :, 2:].abs().max() == 0  # padded source keys get no weight
    assert torch.allclose(maps["self"][0].sum(-1), torch.ones(2, 2, 4))
    assert maps["self"][0][..., 0, 1:].abs().max() == 0  # the first position sees itself only


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_later_target_tokens_never_change_earlier_logits(norm_first):
    model = tiny_model(norm_first=norm_first)
    src, src_mask, tgt = batch()
    logits = model(src, src_mask, tgt)  # (B, T, V)
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 5) % 23
    logits2 = model(src, src_mask, changed)
    assert torch.allclose(logits[:, :3], logits2[:, :3], atol=1e-5)
    assert not torch.allclose(logits[:, 3:], logits2[:, 3:], atol=1e-3)


def test_mha_cache_appends_keys_and_values():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    full = mha(x, causal=True)[0]
    cache, outs = {}, []
    for t in range(5):
        outs.append(mha(x[:, t:t + 1], causal=True, cache=cache)[0])
    assert cache["k"].shape == (2, 2, 5, 4)
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-6)
    memory, cross = torch.randn(2, 3, 8), {}
    first = mha(x[:, :1], memory, cache=cross, static_kv=True)[0]
    again = mha(x[:, :1], None, cache=cross, static_kv=True)[0]  # memory projected once
    assert torch.allclose(first, again)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_full_recomputation(norm_first):
    model = tiny_model(norm_first=norm_first)
    src, src_mask, _ = batch()
    prefix = torch.full((3, 1), 2, dtype=torch.long)
    cached = greedy_decode(model.step, prefix, model.start(src, src_mask), 12)
    full = greedy_decode(model.step, prefix, model.start(src, src_mask, cache=False), 12)
    assert torch.equal(cached, full)
    # logits at every step, teacher-forced on the decoded tokens
    state, steps = model.start(src, src_mask), []
    for t in range(1, cached.shape[1]):
        log_probs, state = model.step(cached[:, :t], state)
        steps.append(log_probs)
    ref = torch.log_softmax(model(src, src_mask, cached[:, :-1]), -1)  # (B, T, V)
    diff = (torch.stack(steps, 1) - ref).abs().max().item()
    print(f"cached vs full recomputation: max |diff| of log-probs = {diff:.1e}")
    assert diff < 1e-5


@torch.no_grad()
def test_beam_search_with_cache_equals_without():
    model = tiny_model()
    src, src_mask, _ = batch()
    prefix = torch.full((3, 1), 2, dtype=torch.long)
    a = beam_search(model.step, prefix, model.start(src, src_mask), 10, eos_id=3, beam_size=3)
    b = beam_search(model.step, prefix, model.start(src, src_mask, cache=False), 10, eos_id=3,
                    beam_size=3)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]


def test_torch_reference_has_same_interface_and_sizes():
    ours, ref = tiny_model(), tiny_model(cls=TorchTransformer)
    src, src_mask, tgt = batch()
    assert ref(src, src_mask, tgt).shape == ours(src, src_mask, tgt).shape == (3, 6, 23)
    n_ours = sum(p.numel() for p in ours.parameters())
    n_ref = sum(p.numel() for p in ref.parameters())
    assert n_ref - n_ours == 2 * 2 * 16  # nn.Transformer adds a final LayerNorm to each stack
    out = greedy_decode(ref.step, torch.full((3, 1), 2), ref.start(src, src_mask), 5)
    assert out.shape[0] == 3


def test_tied_and_shared_embeddings():
    model = tiny_model()
    assert model.out.weight is model.src_embed.table.weight is model.tgt_embed.table.weight
    untied = tiny_model(share_embeddings=False, tie_output=False, tgt_vocab=31)
    assert untied(*batch()).shape[-1] == 31
    with pytest.raises(ValueError, match="shared tokenizer"):
        TransformerConfig(src_vocab=10, tgt_vocab=12)
    with pytest.raises(ValueError, match="teacher_forcing"):
        model(*batch(), teacher_forcing=0.5)


@pytest.mark.parametrize("cls", [Transformer, TorchTransformer])
@pytest.mark.parametrize("shared", [True, False])
def test_token_embeddings_start_as_large_as_the_positions(cls, shared):
    """Regression: Xavier on the (V, E) token table made sqrt(E)-scaled token vectors (rms 0.25)
    about 3x smaller than the sinusoidal positions (0.71) for V = 8000, E = 256, and notebook 10
    trained far slower (BLEU 2.3 against 9.6 after 180 s)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab=8000, tgt_vocab=8000, d_model=256, n_heads=8, d_ff=32,
                            n_enc_layers=1, n_dec_layers=1, share_embeddings=shared, tie_output=shared)
    model = cls(cfg)
    for embed in (model.src_embed, model.tgt_embed):
        tokens = embed.table.weight * embed.scale  # (V, E), what the first block sees besides positions
        assert 0.95 < tokens.std().item() < 1.05
    if not shared:  # the untied output layer keeps Xavier
        assert model.out.weight.std().item() < 0.05


def test_both_model_classes_start_their_attention_projections_alike():
    """Regression: `build` ran Xavier over nn.MultiheadAttention's fused (3E, E) in_proj_weight,
    so the nn.Transformer reference of notebook 10 started with Q/K/V 1/sqrt(2) as large as ours
    (std 0.0625 against 0.0884 at E = 128): the two trained from different initializations."""
    E = 128
    cfg = TransformerConfig(src_vocab=50, tgt_vocab=50, d_model=E, n_heads=4, d_ff=64,
                            n_enc_layers=2, n_dec_layers=2)
    torch.manual_seed(0)
    ours, ref = Transformer(cfg), TorchTransformer(cfg)
    xavier_std = (2 / (E + E)) ** 0.5  # uniform on +-sqrt(6 / (E + E)): std sqrt(2 / (2E))
    q_k_v_ours = [p for n, p in ours.named_parameters() if n.endswith(("W_q.weight", "W_k.weight", "W_v.weight"))]
    q_k_v_ref = [part for n, p in ref.named_parameters() if n.endswith("in_proj_weight") for part in p.chunk(3)]
    assert len(q_k_v_ours) == len(q_k_v_ref) == 3 * (2 + 2 * 2)  # self-attn per block, cross-attn per decoder block
    for w in q_k_v_ours + q_k_v_ref:
        assert w.shape == (E, E) and abs(w.std().item() / xavier_std - 1) < 0.03
    # and the projection biases start at 0 in both (nn.Linear's default would draw them)
    biases = [p for n, p in ours.named_parameters() if "attn.W_" in n and n.endswith(".bias")]
    biases += [p for n, p in ref.named_parameters() if n.endswith(("in_proj_bias", "out_proj.bias"))]
    assert len(biases) == 4 * 6 + 2 * 6 and all((b == 0).all() for b in biases)


@pytest.mark.parametrize("shared", [True, False])
def test_load_from_torch_copies_the_whole_model(shared):
    cfg = TransformerConfig(src_vocab=40, tgt_vocab=40, d_model=16, n_heads=4, d_ff=32, n_enc_layers=2,
                            n_dec_layers=2, dropout=0.0, norm_first=True, share_embeddings=shared,
                            tie_output=shared)
    torch.manual_seed(0)
    ref = TorchTransformer(cfg).eval()
    torch.manual_seed(1)
    ours = Transformer(cfg).eval()
    src, tgt = torch.randint(4, 40, (3, 7)), torch.randint(4, 40, (3, 5))
    mask = torch.arange(7)[None] < torch.tensor([7, 5, 2])[:, None]
    with torch.no_grad():
        before = (ours(src, mask, tgt) - ref(src, mask, tgt)).abs().max().item()
        ours.load_from_torch(ref)
        after = (ours(src, mask, tgt) - ref(src, mask, tgt)).abs().max().item()
    assert before > 0.1 and after < 1e-5
    with pytest.raises(ValueError, match="norm_first"):
        Transformer(replace(cfg, norm_first=False)).load_from_torch(TorchTransformer(replace(cfg, norm_first=False)))


def test_base_model_parameter_count():
    n = transformer_param_count(TransformerConfig())  # 37k shared vocabulary, d_model 512, N = 6
    assert n == 37_000 * 512 + 6 * 3_152_384 + 6 * 4_204_032
    assert 60e6 < n < 66e6  # Table 3 of Vaswani et al.: 65M


def test_forward_and_decoding_on_meta_device():
    with torch.device("meta"):
        model = Transformer(TINY)
        src = torch.randint(4, 23, (2, 7))
        src_mask = torch.ones(2, 7, dtype=torch.bool)
        tgt = torch.randint(4, 23, (2, 5))
    assert model(src, src_mask, tgt).device.type == "meta"
    prefix = torch.full((2, 1), 2, dtype=torch.long, device="meta")
    out = greedy_decode(model.step, prefix, model.start(src, src_mask), 3)
    assert out.device.type == "meta" and out.shape == (2, 4)


@torch.no_grad()
def test_cached_decoding_under_bf16_autocast_stays_close_to_recomputation():
    # notebook 10 decodes under autocast when it is faster (its fast mode may never take that
    # path): the cache must still work there, equal to recomputation up to bfloat16 rounding
    model = tiny_model()
    src, src_mask, _ = batch()
    prefix = torch.full((3, 1), 2, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cached = greedy_decode(model.step, prefix, model.start(src, src_mask), 12)
        state, steps = model.start(src, src_mask), []
        for t in range(1, cached.shape[1]):
            log_probs, state = model.step(cached[:, :t], state)
            steps.append(log_probs.float())
        ref = torch.log_softmax(model(src, src_mask, cached[:, :-1]).float(), -1)  # (B, T, V)
    assert cached.shape == (3, 13) and torch.isfinite(torch.stack(steps)).all()
    assert (torch.stack(steps, 1) - ref).abs().max().item() < 0.1  # bfloat16 keeps ~3 digits


def test_torch_reference_decodes_under_cpu_autocast():
    # nn.TransformerEncoder's inference fast path ignores CPU autocast; encode must avoid it
    ref = tiny_model(cls=TorchTransformer)
    src, src_mask, _ = batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        log_probs, _ = ref.step(torch.full((3, 1), 2), ref.start(src, src_mask))
    assert log_probs.shape == (3, 23) and torch.isfinite(log_probs).all()
    assert torch.backends.mha.get_fastpath_enabled()  # restored afterwards
