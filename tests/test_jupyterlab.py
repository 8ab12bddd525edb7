"""Notebooks git leaves alone: opening a notebook in JupyterLab and letting it save leaves the
file byte-identical, so a student's `git status` stays clean and `git pull` does not conflict.

JupyterLab 4 once added `"collapsed": true` to every solution cell and its own kernel name to
the metadata; `python -m course meta apply` now writes both as JupyterLab does. The
test opens every notebook in a real JupyterLab, driven by headless Chromium, saves it (Ctrl+S,
as autosave would), and compares the bytes; and it round-trips each one through JupyterLab's
contents API (GET, then PUT of the same model).
"""

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from chromium import Browser, find_chromium

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHROMIUM = find_chromium()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, path: str, body: dict | None = None, base: str = "api") -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/{base}/{path}", method="PUT" if body else "GET",
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = response.read()
    return json.loads(answer) if answer else {}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 over copies of the committed notebooks."""
    root = tmp_path_factory.mktemp("lab")
    for path in NOTEBOOKS:
        shutil.copy(path, root / path.name)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
         "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root}",
         "--LanguageServerManager.autodetect=False"],  # jupyter-lsp: no `npm` run, no ~/.npm log
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _api(port, "status")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("JupyterLab did not start") from None
                time.sleep(0.5)
        yield root, port
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


JUPYTER_DIRS = ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR",
                "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR")


def test_jupyter_writes_into_the_test_runs_own_folders_not_home(lab):
    """The server this module starts saved its workspace in ~/.jupyter/lab/workspaces, and a
    later `jupyter lab` of the user's reopened the test's notebooks; kernels wrote connection
    files and IPython profiles under ~ too. The root conftest.py now points every Jupyter and
    IPython folder at a temporary one for the whole run (the servers and kernels inherit it)."""
    from IPython.paths import get_ipython_dir
    from jupyter_core.paths import jupyter_config_dir, jupyter_data_dir, jupyter_runtime_dir

    home = Path.home().resolve()
    unset = [name for name in JUPYTER_DIRS if not os.environ.get(name)]
    assert not unset, f"conftest.py does not isolate {unset}"
    for path in (jupyter_config_dir(), jupyter_data_dir(), jupyter_runtime_dir(), get_ipython_dir(),
                 *(os.environ[name] for name in JUPYTER_DIRS)):
        assert not Path(path).resolve().is_relative_to(home), f"{path} is in the home folder"
    root, port = lab
    workspace = f"seq-isolation-{os.getpid()}"
    _api(port, workspace, {"data": {}, "metadata": {"id": workspace}}, base="lab/api/workspaces")
    written = [p.name for p in Path(os.environ["JUPYTERLAB_WORKSPACES_DIR"]).glob("*.jupyterlab-workspace")]
    assert any(workspace in name for name in written), written
    assert not list((home / ".jupyter").glob(f"lab/workspaces/*{workspace}*"))


def _as_saved_here(committed: bytes) -> bytes:
    """The committed file, with the Python version a kernel here reports (JupyterLab writes the
    running kernel's `language_info.version`; the committed runs record theirs)."""
    recorded = json.loads(committed)["metadata"]["language_info"]["version"]
    return committed.replace(f'"version": "{recorded}"'.encode(),
                             f'"version": "{platform.python_version()}"'.encode())


def test_a_round_trip_through_the_contents_api_changes_no_byte(lab):
    root, port = lab
    for path in NOTEBOOKS:
        model = _api(port, f"contents/{path.name}?content=1")
        _api(port, f"contents/{path.name}", {"type": "notebook", "format": "json", "content": model["content"]})
        assert (root / path.name).read_bytes() == path.read_bytes(), f"{path.name} changed"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_opening_and_saving_in_jupyterlab_changes_no_byte(lab):
    root, port = lab
    browser = Browser(CHROMIUM)
    try:
        for path in NOTEBOOKS:
            saved = root / path.name
            before = saved.stat().st_mtime_ns
            browser.goto(f"http://127.0.0.1:{port}/lab/tree/{path.name}?reset", settle=1)
            browser.wait_for("document.querySelectorAll('.jp-NotebookPanel .jp-Cell').length > 3", timeout=90)
            # the kernel has connected (it sets language_info), as before any autosave
            browser.wait_for("!!document.querySelector('.jp-Notebook-ExecutionIndicator[data-status=\"idle\"]')",
                             timeout=90)
            for kind in ("keyDown", "keyUp"):  # Ctrl+S
                browser.send("Input.dispatchKeyEvent", type=kind, modifiers=2, key="s", code="KeyS",
                             windowsVirtualKeyCode=83)
            # a save before the kernel's info arrives keeps the recorded Python version (older
            # JupyterLabs sometimes do that): byte-identical too
            expected, deadline = _as_saved_here(path.read_bytes()), time.monotonic() + 30
            while not (saved.stat().st_mtime_ns != before and saved.read_bytes() in (expected, path.read_bytes())):
                if time.monotonic() > deadline:  # saved (maybe half-written a moment ago), and different
                    assert saved.stat().st_mtime_ns != before, f"JupyterLab did not save {path.name}"
                    assert saved.read_bytes() in (expected, path.read_bytes()), (
                        f"{path.name} changed when JupyterLab saved it: run `python -m course meta apply`")
                time.sleep(0.2)
    finally:
        browser.close()
