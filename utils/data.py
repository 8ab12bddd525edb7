"""The course datasets: where they come from, where they live, and loaders that check them.

Every file is looked for in the data directory first (`SEQ_DATA_DIR`, default: the repo's
`data/` cache; a relative path is read from the repository root, wherever Python runs). A
missing file is downloaded from its original source into that directory, atomically (a
temporary file renamed into place) and only if its checksum matches. Offline machines point
`SEQ_DATA_DIR` at a mirror with the same layout.

`python -m utils.data fetch [--all | NAME ...]` downloads and checks datasets ahead of time
(a class, a flight) with a progress bar; `python -m utils.data readme` rewrites the table of
every file, URL and checksum in data/README.md from `REGISTRY` (a test keeps them in sync).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from utils.settings import marked_section, replace_marked_section

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO_ROOT / "data"  # the data directory when SEQ_DATA_DIR is unset (git-ignored)


class DataError(RuntimeError):
    """A dataset file is missing, could not be downloaded, or failed its checksum."""


@dataclass(frozen=True)
class Remote:
    """One file of a dataset: its path in the data directory and where it comes from.

    `sha256` is taken over `digest_of`: the file's bytes ("file"), its gunzipped bytes
    ("gunzip": Fashion-MNIST mirrors recompress the .gz wrapper but keep the IDX content) or
    its rows ("rows": the IMDB parquet files are re-encoded by mirrors but keep the reviews).
    """

    path: str  # relative to the data directory, e.g. "imdb/train.parquet"
    url: str  # the original source
    sha256: str
    digest_of: str = "file"  # "file" | "gunzip" | "rows"


def _files(folder: str, base_url: str, names_and_digests: dict, digest_of: str = "file") -> dict:
    return {
        name: Remote(f"{folder}/{name}", base_url + name, sha, digest_of)
        for name, sha in names_and_digests.items()
    }


_HF_IMDB = "https://huggingface.co/datasets/stanfordnlp/imdb/resolve/main/plain_text/"
_M30K = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
_FMNIST = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

REGISTRY: dict[str, dict[str, Remote]] = {
    "imdb": {
        "train.parquet": Remote(
            "imdb/train.parquet", _HF_IMDB + "train-00000-of-00001.parquet",
            "2270ab9e0bdb49eba655bb32cc1abffd9c1d5ce40dab2709ddbab316c97f7c3b", "rows",
        ),
        "test.parquet": Remote(
            "imdb/test.parquet", _HF_IMDB + "test-00000-of-00001.parquet",
            "635dc2e1a9235bbea9bccf7b9ab72f295220d2010be52a072eaba7f599e1ef15", "rows",
        ),
    },
    "tinyshakespeare": {
        "input.txt": Remote(
            "tinyshakespeare/input.txt",
            "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
            "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        ),
    },
    "multi30k": _files("multi30k", _M30K, {
        "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
        "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
        "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
        "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
        "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
        "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
        "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
        "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
        "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    }),
    "fashion-mnist": _files("fashion-mnist", _FMNIST, {
        "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    }, digest_of="gunzip"),
}


def data_dir() -> Path:
    """The data directory: `SEQ_DATA_DIR` if set, else the repo's `data/` download cache.
    A relative `SEQ_DATA_DIR` is relative to the repository root, not to the current folder,
    so `SEQ_DATA_DIR=mirror` means the same in `pytest` (run from the root) and in a notebook
    (whose kernel runs in notebooks/); where the current folder holds another folder of that
    name, a warning (or the error below) says which one is read. A `SEQ_DATA_DIR` that does not
    exist is refused (a typo would otherwise be created and filled by a fresh download); the
    default cache is created."""
    setting = os.environ.get("SEQ_DATA_DIR", "").strip()
    if not setting:
        return DEFAULT_CACHE
    path = Path(setting).expanduser()
    here = None  # what a relative setting would mean from the current folder, if that differs
    if not path.is_absolute():
        here, path = (Path.cwd() / path).resolve(), REPO_ROOT / path
        here = here if here.is_dir() and here != path.resolve() else None
    if not path.is_dir():
        meant = (f" The current folder has {here}: a relative SEQ_DATA_DIR is read from the "
                 f"repository root, not from here, so give that one as an absolute path "
                 f"(SEQ_DATA_DIR={here})." if here else "")
        raise DataError(
            f"SEQ_DATA_DIR={setting!r} names {path}, which is not a folder.{meant} Fix the setting "
            f"(a relative path is read from the repository root, {REPO_ROOT}), create the folder "
            "first if you mean a new one, or unset SEQ_DATA_DIR to use the course's own cache.")
    if here and (setting, str(here)) not in _noticed:
        _noticed.add((setting, str(here)))
        warnings.warn(f"SEQ_DATA_DIR={setting!r} is relative, so it is read from the repository "
                      f"root: the data comes from {path}, not {here} in the current folder. Give "
                      "an absolute path to use that one.", stacklevel=2)
    return path


_noticed: set[tuple[str, str]] = set()  # relative settings already warned about in this process


# ---------------------------------------------------------------------------- checksums
def digest(path: Path, digest_of: str = "file") -> str:
    """sha256 of a file's bytes, gunzipped bytes or parquet rows (see `Remote`)."""
    h = hashlib.sha256()
    if digest_of == "file":
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    elif digest_of == "gunzip":
        with gzip.open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    elif digest_of == "rows":
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["text", "label"])
        for text, label in zip(table["text"].to_pylist(), table["label"].to_pylist()):
            h.update(f"{label}\t{text}\n".encode())
    else:
        raise ValueError(f"digest_of must be 'file', 'gunzip' or 'rows', got {digest_of!r}")
    return h.hexdigest()


_verified: set[tuple] = set()  # files already checked in this process, by `file_identity`


def file_identity(path: Path) -> tuple:
    """What a checksum already checked in this process is remembered by: path, inode, size,
    modification and (on POSIX) change time. A rewrite changes at least one of them, even a copy
    of the same size that puts the old modification time back (it still moves the change time)."""
    stat = path.stat()
    return str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def _check(remote: Remote, path: Path, source: str, advice: str) -> None:
    if path.stat().st_size == 0:  # its "checksum" would be the hash of nothing
        raise DataError(f"{source} is an empty file (0 bytes), not the expected data.\n{advice}")
    try:
        actual = digest(path, remote.digest_of)
    except Exception as err:  # unreadable gzip/parquet is corruption too
        actual = f"unreadable ({type(err).__name__}: {err})"
    if actual != remote.sha256:
        raise DataError(
            f"{source} failed its checksum.\n  expected sha256 ({remote.digest_of}): "
            f"{remote.sha256}\n  got: {actual}\n{advice}"
        )


def _repair_advice(remote: Remote, root: Path) -> str:
    """What to do about a bad file under `root`: in the course's own cache, delete it and
    download it again; in a folder SEQ_DATA_DIR names (perhaps a mirror others share), deleting
    is not ours to do: repair that copy, or use the course's cache instead."""
    if Path(root).resolve() != DEFAULT_CACHE.resolve():
        return (f"The copy in {root} (SEQ_DATA_DIR) is corrupted or incomplete. If others share "
                f"that folder, restore '{remote.path}' there from {remote.url} (sources and "
                "checksums: data/README.md); or unset SEQ_DATA_DIR to download a copy into the "
                "course's own cache.")
    return (f"The file is corrupted or incomplete. Delete it and run again to download it from "
            f"{remote.url}, or point SEQ_DATA_DIR at a folder with a good copy.")


# ---------------------------------------------------------------------------- download
def download(remote: Remote, dest: Path, timeout: float = 60.0,
             progress: bool | None = None) -> Path:
    """Fetch `remote.url` to `dest` atomically; keep it only if its checksum matches.
    `progress` shows a progress bar (default: unless `SEQ_QUIET=1`)."""
    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]  # deepest first
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    if progress is None:
        progress = os.environ.get("SEQ_QUIET", "0") != "1"
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(remote.url, timeout=timeout) as response:
                    size = int(response.headers.get("Content-Length") or 0) or None
                    with _progress_bar(size, remote.path, progress) as bar:
                        for chunk in iter(lambda: response.read(1 << 20), b""):
                            out.write(chunk)
                            bar.update(len(chunk))
            except (urllib.error.URLError, OSError) as err:
                raise DataError(
                    f"Could not download {remote.path} from {remote.url} ({err}).\n"
                    f"If this machine is offline, copy the file to {dest} by hand, or set "
                    f"SEQ_DATA_DIR to a folder that holds '{remote.path}' (now: {dest.parent.parent})."
                ) from err
        _check(remote, tmp, f"The download of {remote.path} from {remote.url}",
               f"Nothing was kept. Run again (a download cut short fails this way); if it fails "
               f"again, the server sends another file: copy a good '{remote.path}' to {dest}.")
        os.replace(tmp, dest)  # atomic: readers never see a half-written file
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in made:  # the folders made for this file, in a mirror others may share
            try:
                folder.rmdir()
            except OSError:  # no longer empty: something else is in it now
                break
        raise
    return dest


def _progress_bar(total: int | None, name: str, show: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not show, leave=True)


def fetch(dataset: str, name: str, root: Path | None = None) -> Path:
    """Path to a verified file of `dataset`, downloading it into the data directory if missing."""
    if dataset not in REGISTRY:
        raise DataError(f"Unknown dataset {dataset!r}; the course has {sorted(REGISTRY)}.")
    if name not in REGISTRY[dataset]:
        raise DataError(f"{dataset} has no file {name!r}; it has {sorted(REGISTRY[dataset])}.")
    return fetch_remote(REGISTRY[dataset][name], root)


def fetch_remote(remote: Remote, root: Path | None = None) -> Path:
    """`fetch` for any `Remote` (tests use this with a local server)."""
    root = data_dir() if root is None else Path(root)
    path = root / remote.path
    if not path.exists():
        return download(remote, path)
    key = file_identity(path)
    if key not in _verified:
        _check(remote, path, f"{path}", _repair_advice(remote, root))
        _verified.add(key)
    return path


# ---------------------------------------------------------------------------- loaders
def _check_split(split: str, allowed: tuple[str, ...]) -> None:
    if split not in allowed:
        raise ValueError(f"split must be one of {allowed}, got {split!r}")


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")


@dataclass
class TextClassification:
    """Texts with integer labels (IMDB: 0 = negative, 1 = positive)."""

    texts: list[str]
    labels: np.ndarray  # (N,) int64

    def __len__(self) -> int:
        return len(self.texts)


def load_imdb(split: str = "train", limit: int | None = None) -> TextClassification:
    """IMDB reviews (Maas et al. 2011): 25,000 per split, raw text with `<br />` tags.

    The files list all negative reviews first, so `limit` takes a seeded random subset
    (kept in file order) rather than the first rows, which would all be negative.
    """
    import pyarrow.parquet as pq

    _check_split(split, ("train", "test"))
    _check_limit(limit)
    table = pq.read_table(fetch("imdb", f"{split}.parquet"), columns=["text", "label"])
    texts = table["text"].to_pylist()
    labels = np.asarray(table["label"].to_pylist(), dtype=np.int64)
    if limit is not None and limit < len(texts):
        keep = subset_rows(len(texts), limit)
        texts, labels = [texts[i] for i in keep], labels[keep]
    return TextClassification(texts, labels)


def subset_rows(n_rows: int, limit: int | None) -> np.ndarray:
    """The rows `load_imdb(limit=...)` keeps: a seeded random subset in file order (all rows
    when `limit` is None or not smaller), e.g. to select the same reviews from a `datasets` table."""
    _check_limit(limit)
    if limit is None or limit >= n_rows:
        return np.arange(n_rows)
    return np.sort(np.random.default_rng(0).permutation(n_rows)[:limit])


def load_tiny_shakespeare(
    split: str = "train", limit: int | None = None, val_fraction: float = 0.1
) -> str:
    """Tiny Shakespeare as one string; the last `val_fraction` of the text is the validation split.

    A contiguous split (not random lines) keeps validation text unseen, as in char-rnn.
    `limit` keeps the first `limit` characters of the split.
    """
    _check_split(split, ("train", "val", "all"))
    _check_limit(limit)
    text = fetch("tinyshakespeare", "input.txt").read_text(encoding="utf-8")
    n_train = int(len(text) * (1 - val_fraction))
    text = {"train": text[:n_train], "val": text[n_train:], "all": text}[split]
    return text[:limit] if limit is not None else text


MULTI30K_LANGUAGES = ("en", "de", "fr")
_MULTI30K_FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}


def load_multi30k(
    split: str = "train", src: str = "de", tgt: str = "en", limit: int | None = None
) -> list[tuple[str, str]]:
    """Multi30k task 1 sentence pairs (src, tgt), raw and untokenized.

    Sizes: train 29,000, val 1,014, test 1,000 (the 2016 Flickr test set).
    """
    _check_split(split, tuple(_MULTI30K_FILES))
    _check_limit(limit)
    for lang in (src, tgt):
        if lang not in MULTI30K_LANGUAGES:
            raise ValueError(f"language must be one of {MULTI30K_LANGUAGES}, got {lang!r}")
    if src == tgt:
        raise ValueError(f"src and tgt must differ, both are {src!r}")

    def lines(lang: str) -> list[str]:
        path = fetch("multi30k", f"{_MULTI30K_FILES[split]}.{lang}.gz")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    pairs = list(zip(lines(src), lines(tgt), strict=True))
    return pairs[:limit] if limit is not None else pairs


FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped IDX file (the MNIST format): big-endian dims, then uint8 data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[:4], "big")
    if magic >> 8 != 0x08:  # 0x08 = unsigned byte data; the low byte is the number of dims
        raise DataError(f"{path} is not a uint8 IDX file (magic {magic:#010x}).")
    ndim = magic & 0xFF
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist(split: str = "train", limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST: images (N, 28, 28) uint8 and labels (N,) int64; 60,000 train / 10,000 test."""
    _check_split(split, ("train", "test"))
    _check_limit(limit)
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(fetch("fashion-mnist", f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(fetch("fashion-mnist", f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)
    return images[:limit], labels[:limit]


# ---------------------------------------------------------------------------- command line
README = REPO_ROOT / "data" / "README.md"
TABLE_START, TABLE_END = "<!-- registry:start -->", "<!-- registry:end -->"


def registry_table() -> str:
    """Every file of every dataset with its URL and checksum, as a Markdown table."""
    rows = ["| dataset | file | URL | sha256 of |", "|---|---|---|---|"]
    for dataset, files in REGISTRY.items():
        for remote in files.values():
            rows.append(f"| {dataset} | `{remote.path}` | <{remote.url}> | {remote.digest_of}: "
                        f"`{remote.sha256}` |")
    return "\n".join(rows)


def readme_table(readme: Path = README) -> str:
    return marked_section(readme, TABLE_START, TABLE_END)


def update_readme(readme: Path = README) -> None:
    replace_marked_section(readme, TABLE_START, TABLE_END, registry_table())


def fetch_datasets(names: list[str], root: Path | None = None, progress: bool = True) -> int:
    """Download what is missing and verify every file of the named datasets; prints one line
    per file and returns the number of files that failed."""
    root = data_dir() if root is None else Path(root)
    failed = 0
    for dataset in names:
        for remote in REGISTRY[dataset].values():
            path = root / remote.path
            try:
                if path.exists():
                    fetch_remote(remote, root)
                    print(f"{remote.path}: present, checksum ok")
                else:
                    download(remote, path, progress=progress)
                    print(f"{remote.path}: downloaded, checksum ok")
            except DataError as err:
                failed += 1
                print(f"{remote.path}: FAILED\n  " + str(err).replace("\n", "\n  "))
    return failed


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    get = commands.add_parser("fetch", help="download and check datasets into the data directory")
    get.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(REGISTRY)}")
    get.add_argument("--all", action="store_true", help="every dataset of the course")
    commands.add_parser("readme", help="rewrite the file table of data/README.md from REGISTRY")
    args = parser.parse_args(argv)
    if args.command == "readme":
        update_readme()
        print(f"{README.relative_to(REPO_ROOT)}: table rewritten from REGISTRY")
        return 0
    unknown = [n for n in args.names if n not in REGISTRY]
    if unknown or not (args.all or args.names):
        parser.error(f"name datasets ({', '.join(REGISTRY)}) or pass --all"
                     + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    names = list(REGISTRY) if args.all else args.names
    print(f"data directory: {data_dir()} (set SEQ_DATA_DIR to change it)")
    failed = fetch_datasets(names)
    files = sum(len(REGISTRY[n]) for n in names)
    print(f"{files - failed} of {files} files ready" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
