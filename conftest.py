"""Test settings: fast mode and no progress bars, also for the notebook kernels nbval starts.

On a machine without a GPU the notebooks run on `cpu:0` with `SEQ_DEVICE_CHECK=1`: the CPU
under another name, so every number is the same, while `course.devicecheck` fails any cell that
leaves a model or tensor off `run.device` (what would break, or quietly stay on the CPU, on a
GPU). With a GPU they run on it for real.
"""

import atexit
import os
import shutil
import tempfile

# Jupyter and IPython keep state in the home folder: a JupyterLab server saves its workspace
# there (and the user's next `jupyter lab` reopens the test's notebooks), kernels write
# connection files, signatures and IPython profiles. The tests, and every server and kernel they
# start (they inherit the environment), use folders of their own, removed when the run ends.
JUPYTER_HOME = tempfile.mkdtemp(prefix="seq-test-jupyter-")
atexit.register(shutil.rmtree, JUPYTER_HOME, ignore_errors=True)
for _name, _folder in {"JUPYTER_CONFIG_DIR": "config", "JUPYTER_DATA_DIR": "data",
                       "JUPYTER_RUNTIME_DIR": "runtime", "IPYTHONDIR": "ipython",
                       "JUPYTERLAB_SETTINGS_DIR": "lab-settings",
                       "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces"}.items():
    os.environ[_name] = os.path.join(JUPYTER_HOME, _folder)

os.environ.setdefault("SEQ_FAST", "1")  # `SEQ_FAST=0 pytest` runs the notebooks in full mode
os.environ["SEQ_QUIET"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")


def _has_accelerator() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps and mps.is_available())


if "SEQ_DEVICE" not in os.environ and not _has_accelerator():
    os.environ["SEQ_DEVICE"] = "cpu:0"
    os.environ["SEQ_DEVICE_CHECK"] = "1"
