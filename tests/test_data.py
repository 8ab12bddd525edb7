"""Data registry, downloads (against a local HTTP server on 127.0.0.1) and the loaders."""

import functools
import gzip
import hashlib
import http.server
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from utils import data
from utils.data import DataError, Remote, digest, fetch_remote


@pytest.fixture
def server(tmp_path):
    """Serve tmp_path/www on a free port of 127.0.0.1; yields the base URL."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def _remote(url: str, content: bytes, **kw) -> Remote:
    return Remote("toy/file.txt", url, kw.pop("sha256", hashlib.sha256(content).hexdigest()), **kw)


def test_download_verifies_and_places_the_file(server, tmp_path):
    www, base = server
    (www / "file.txt").write_bytes(b"to be or not to be\n")
    remote = _remote(base + "file.txt", b"to be or not to be\n")
    path = fetch_remote(remote, root=tmp_path / "cache")
    assert path == tmp_path / "cache" / "toy" / "file.txt"
    assert path.read_bytes() == b"to be or not to be\n"
    assert fetch_remote(remote, root=tmp_path / "cache") == path  # second call: no download


def test_checksum_mismatch_is_rejected_and_leaves_nothing(server, tmp_path):
    www, base = server
    (www / "file.txt").write_bytes(b"tampered")
    remote = _remote(base + "file.txt", b"original")
    with pytest.raises(DataError, match="failed its checksum") as err:
        fetch_remote(remote, root=tmp_path / "cache")
    assert base + "file.txt" in str(err.value)
    assert not (tmp_path / "cache").exists()  # no partial or bad file, and no folder made for it


def test_offline_error_names_file_url_and_setting(tmp_path):
    remote = _remote("http://127.0.0.1:9/file.txt", b"x")  # port 9 (discard): nothing listens
    with pytest.raises(DataError) as err:
        fetch_remote(remote, root=tmp_path)
    message = str(err.value)
    for needed in ("toy/file.txt", "http://127.0.0.1:9/file.txt", "SEQ_DATA_DIR", "offline"):
        assert needed in message
    assert not (tmp_path / "toy" / "file.txt").exists()


def test_corrupted_local_file_is_reported(tmp_path, monkeypatch):
    """In the course's own cache (here tmp_path/data), deleting and downloading again is right."""
    monkeypatch.setattr(data, "DEFAULT_CACHE", tmp_path / "data")
    (tmp_path / "data" / "toy").mkdir(parents=True)
    (tmp_path / "data" / "toy" / "file.txt").write_bytes(b"half a fi")
    with pytest.raises(DataError, match="corrupted.*Delete it and run again"):
        fetch_remote(_remote("http://127.0.0.1:9/file.txt", b"half a file"), root=tmp_path / "data")


def test_a_file_rewritten_after_its_check_is_checked_again(tmp_path):
    """The process remembers a passed checksum by `file_identity`; other bytes of the same size
    written over the file later, even with its old modification time put back, are checked again."""
    import os

    (tmp_path / "toy").mkdir()
    good = tmp_path / "toy" / "file.txt"
    good.write_bytes(b"original")
    remote = _remote("http://127.0.0.1:9/file.txt", b"original")
    assert fetch_remote(remote, root=tmp_path) == good
    stat = good.stat()
    good.write_bytes(b"tampered")  # same size
    os.utime(good, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(DataError, match="failed its checksum"):
        fetch_remote(remote, root=tmp_path)


def test_a_corrupted_file_in_a_mirror_is_not_for_deleting(tmp_path, monkeypatch):
    """In a folder SEQ_DATA_DIR names (a mirror others may share), "delete it" is wrong advice."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "file.txt").write_bytes(b"half a fi")
    monkeypatch.setenv("SEQ_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError) as err:
        fetch_remote(_remote("http://127.0.0.1:9/file.txt", b"half a file"))
    message = str(err.value)
    assert f"The copy in {tmp_path} (SEQ_DATA_DIR)" in message and "unset SEQ_DATA_DIR" in message
    assert "Delete it" not in message and "data/README.md" in message


def test_gunzip_digest_ignores_the_gzip_wrapper(tmp_path):
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    a.write_bytes(gzip.compress(b"same content", compresslevel=1, mtime=0))
    b.write_bytes(gzip.compress(b"same content", compresslevel=9, mtime=1))
    assert a.read_bytes() != b.read_bytes()
    assert digest(a, "gunzip") == digest(b, "gunzip") == hashlib.sha256(b"same content").hexdigest()


def test_read_idx_parses_a_tiny_file(tmp_path):
    header = bytes([0, 0, 8, 3]) + (2).to_bytes(4, "big") + (2).to_bytes(4, "big") * 2
    path = tmp_path / "toy-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(header + bytes(range(8))))
    images = data.read_idx(path)
    assert images.shape == (2, 2, 2) and images.dtype == np.uint8 and images[1, 1, 1] == 7


def test_unknown_names_and_bad_arguments_are_explained():
    with pytest.raises(DataError, match="Unknown dataset"):
        data.fetch("imagenet", "x")
    with pytest.raises(ValueError, match="split"):
        data.load_imdb("validation")
    with pytest.raises(ValueError, match="limit"):
        data.load_tiny_shakespeare(limit=0)
    with pytest.raises(ValueError, match="differ"):
        data.load_multi30k(src="en", tgt="en")


def test_default_data_dir_is_the_repo_cache(monkeypatch):
    monkeypatch.delenv("SEQ_DATA_DIR", raising=False)
    assert data.data_dir() == Path(data.__file__).resolve().parent.parent / "data"


# ------------------------------------------------------- the real datasets (offline mirror)
needs_data = pytest.mark.skipif(
    not (data.data_dir() / "tinyshakespeare" / "input.txt").exists(),
    reason="course data not available: set SEQ_DATA_DIR to the dataset mirror",
)


@needs_data
@pytest.mark.parametrize("dataset", sorted(data.REGISTRY))
def test_every_registered_file_matches_its_checksum(dataset):
    for name in data.REGISTRY[dataset]:
        assert data.fetch(dataset, name).exists()


@needs_data
def test_loaders_return_the_documented_sizes():
    assert len(data.load_tiny_shakespeare("all")) == 1_115_394
    train, val = data.load_tiny_shakespeare("train"), data.load_tiny_shakespeare("val")
    assert train + val == data.load_tiny_shakespeare("all")
    assert [len(data.load_multi30k(s, "en", "fr")) for s in ("train", "val", "test")] == [
        29_000, 1_014, 1_000]
    images, labels = data.load_fashion_mnist("test", limit=100)
    assert images.shape == (100, 28, 28) and images.dtype == np.uint8 and labels.max() <= 9


@needs_data
def test_imdb_limit_takes_a_balanced_seeded_subset():
    full = data.load_imdb("test")
    assert len(full) == 25_000 and full.labels.mean() == 0.5
    a, b = data.load_imdb("test", limit=400), data.load_imdb("test", limit=400)
    assert a.texts == b.texts and 0.4 < a.labels.mean() < 0.6
    assert a.texts == [full.texts[i] for i in data.subset_rows(len(full), 400)]  # the same rows


def test_subset_rows_is_sorted_seeded_and_everything_without_a_limit():
    rows = data.subset_rows(1000, 10)
    assert len(rows) == 10 and list(rows) == sorted(rows) and list(rows) == list(data.subset_rows(1000, 10))
    assert list(data.subset_rows(5, None)) == list(range(5)) == list(data.subset_rows(5, 50))
    with pytest.raises(ValueError, match="limit"):
        data.subset_rows(5, 0)


def test_relative_data_dir_is_read_from_the_repo_root(monkeypatch, tmp_path):
    """`SEQ_DATA_DIR=data` names the same folder from the root (pytest) and from notebooks/
    (a kernel), so a notebook finds the data the tests find."""
    repo = Path(data.__file__).resolve().parent.parent
    monkeypatch.setenv("SEQ_DATA_DIR", "data")
    for cwd in (repo, repo / "notebooks", tmp_path):
        monkeypatch.chdir(cwd)
        assert data.data_dir() == repo / "data"
    monkeypatch.setenv("SEQ_DATA_DIR", str(tmp_path))
    assert data.data_dir() == tmp_path


@pytest.mark.parametrize("setting", ["../shraed/data", "no-such-mirror-folder"])
def test_a_data_dir_setting_that_names_no_folder_is_refused(monkeypatch, tmp_path, setting):
    """A mistyped SEQ_DATA_DIR was created silently and filled by a fresh download (a relative
    one inside the repository); now it is refused, naming the setting and the path it means."""
    repo = Path(data.__file__).resolve().parent.parent
    monkeypatch.setenv("SEQ_DATA_DIR", setting)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=rf"SEQ_DATA_DIR='{re.escape(setting)}' names .* not a folder"):
        data.data_dir()
    with pytest.raises(DataError, match="not a folder"):
        fetch_remote(_remote("http://127.0.0.1:9/file.txt", b"x"))
    assert not (repo / setting).exists() and list(tmp_path.iterdir()) == []
    monkeypatch.setenv("SEQ_DATA_DIR", "")  # unset or empty: the course's cache, created on demand
    assert data.data_dir() == repo / "data"


@pytest.fixture
def toy_registry(server, monkeypatch, tmp_path):
    """Two tiny datasets served from 127.0.0.1, in place of the course's registry."""
    www, base = server
    files = {"a.txt": b"alpha\n" * 1000, "b.txt": b"beta\n", "c.txt": b"gamma\n"}
    for name, content in files.items():
        (www / name).write_bytes(content)
    sha = {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}
    registry = {
        "toy": {n: Remote(f"toy/{n}", base + n, sha[n]) for n in ("a.txt", "b.txt")},
        "other": {"c.txt": Remote("other/c.txt", base + "c.txt", sha["c.txt"])},
    }
    monkeypatch.setattr(data, "REGISTRY", registry)
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("SEQ_DATA_DIR", str(tmp_path / "cache"))
    return www, tmp_path / "cache"


def test_fetch_command_downloads_and_checks_with_a_progress_bar(toy_registry, capsys):
    www, cache = toy_registry
    assert data.main(["fetch", "toy"]) == 0
    out, err = capsys.readouterr()
    assert (cache / "toy" / "a.txt").read_bytes() == b"alpha\n" * 1000
    assert not (cache / "other").exists()
    assert "toy/a.txt: downloaded, checksum ok" in out and "2 of 2 files ready" in out
    assert "toy/a.txt" in err and "100%" in err  # the progress bar
    assert data.main(["fetch", "--all"]) == 0
    out, _ = capsys.readouterr()
    assert "toy/a.txt: present, checksum ok" in out and "other/c.txt: downloaded" in out
    assert "3 of 3 files ready" in out


def test_fetch_command_reports_bad_files_and_names(toy_registry, capsys):
    www, cache = toy_registry
    (www / "c.txt").write_bytes(b"tampered\n")
    assert data.main(["fetch", "other"]) == 1
    out, _ = capsys.readouterr()
    assert "other/c.txt: FAILED" in out and "failed its checksum" in out
    assert not (cache / "other" / "c.txt").exists()
    with pytest.raises(SystemExit):
        data.main(["fetch", "imagenet"])
    with pytest.raises(SystemExit):
        data.main(["fetch"])


def test_data_readme_lists_every_url_and_checksum():
    table = data.readme_table()
    assert table == data.registry_table(), "run `python -m utils.data readme`"
    for files in data.REGISTRY.values():
        for remote in files.values():
            assert remote.url in table and remote.sha256 in table


def test_a_relative_data_dir_that_exists_only_here_names_both_folders(monkeypatch, tmp_path):
    """`SEQ_DATA_DIR=mirror` from a folder that holds `mirror/` was refused as "not a folder",
    naming only the repository's `mirror`: the message now names the folder here too, and how
    to mean it (an absolute path)."""
    repo = Path(data.__file__).resolve().parent.parent
    (tmp_path / "my-mirror").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEQ_DATA_DIR", "my-mirror")
    with pytest.raises(DataError) as err:
        data.data_dir()
    message = str(err.value)
    assert str(repo / "my-mirror") in message and str(tmp_path / "my-mirror") in message
    assert "relative" in message and "repository root" in message
    assert f"SEQ_DATA_DIR={tmp_path / 'my-mirror'}" in message


def test_a_relative_data_dir_read_from_the_repo_root_says_so_when_here_differs(monkeypatch, tmp_path):
    """Where both the repository's and the current folder's `mirror/` exist, the repository's is
    used, as documented, with a notice naming the other one (it was silent)."""
    repo, here = tmp_path / "repo", tmp_path / "elsewhere"
    (repo / "mirror").mkdir(parents=True)
    (here / "mirror").mkdir(parents=True)
    monkeypatch.setattr(data, "REPO_ROOT", repo)
    monkeypatch.setattr(data, "_noticed", set())
    monkeypatch.chdir(here)
    monkeypatch.setenv("SEQ_DATA_DIR", "mirror")
    with pytest.warns(UserWarning, match=rf"read from the repository root.*{re.escape(str(repo / 'mirror'))}"
                                         rf".*not {re.escape(str(here / 'mirror'))}"):
        assert data.data_dir() == repo / "mirror"
    monkeypatch.chdir(repo)  # from the root, the two are one folder: nothing to say
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert data.data_dir() == repo / "mirror"


def test_an_empty_file_is_reported_as_empty_not_as_a_checksum(tmp_path, server):
    """A zero-byte file (a copy that failed, a disk that filled up) was "failed its checksum ...
    got: e3b0c442..." (the hash of nothing); it is now called what it is."""
    empty_sha = hashlib.sha256(b"").hexdigest()
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "file.txt").write_bytes(b"")
    with pytest.raises(DataError, match=r"is an empty file \(0 bytes\)") as err:
        fetch_remote(_remote("http://127.0.0.1:9/file.txt", b"x"), root=tmp_path)
    assert empty_sha not in str(err.value) and "file.txt" in str(err.value)
    www, base = server  # a server that sends nothing
    (www / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match=r"is an empty file \(0 bytes\)") as err:
        fetch_remote(_remote(base + "empty.txt", b"x"), root=tmp_path / "cache")
    assert empty_sha not in str(err.value)


def test_a_failed_download_leaves_no_empty_folder_in_a_shared_mirror(tmp_path, server):
    """A download into a mirror others share created `toy/` and left it empty when it failed."""
    mirror = tmp_path / "mirror"
    (mirror / "kept").mkdir(parents=True)  # a folder that was there stays
    with pytest.raises(DataError):
        fetch_remote(_remote("http://127.0.0.1:9/file.txt", b"x"), root=mirror)  # offline
    assert sorted(p.name for p in mirror.iterdir()) == ["kept"]
    www, base = server
    (www / "file.txt").write_bytes(b"tampered")
    with pytest.raises(DataError, match="failed its checksum"):
        fetch_remote(Remote("toy/deeper/file.txt", base + "file.txt", hashlib.sha256(b"x").hexdigest()),
                     root=mirror)
    assert sorted(p.name for p in mirror.iterdir()) == ["kept"]
    remote = Remote("kept/file.txt", base + "file.txt", hashlib.sha256(b"tampered").hexdigest())
    assert fetch_remote(remote, root=mirror).read_bytes() == b"tampered"  # a success keeps its folders
