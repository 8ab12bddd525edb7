"""Refuse an old Python at once. pip checks `requires-python` (pyproject.toml) only after it has
downloaded every dependency (on Python 3.9: torch 2.8 and 4.9 GB of CUDA libraries, then minutes
of backtracking); pip runs this file first, when it prepares the course's own package, which is
the first line of requirements.txt. Everything else about the package is in pyproject.toml."""

import sys

if sys.version_info < (3, 10):  # noqa: UP036 (this file exists for exactly that Python)
    sys.exit("This course needs Python 3.10 or newer; this is Python " + sys.version.split()[0] + ". "
             "Make a virtual environment with a newer Python (e.g. `python3.12 -m venv .venv`) "
             "and install there.")

from setuptools import setup  # noqa: E402

setup()
