"""The repository's own files: license, supported Python versions, install files agree."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()  # tomllib needs 3.11; we support 3.10


def project_field(name: str) -> str:
    return re.search(rf'^{name} = "([^"]*)"$', PYPROJECT, re.M)[1]


def test_license_file_is_the_mit_license_the_metadata_names():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the course authors" in text
    assert project_field("license") == "MIT"


def test_python_versions_have_no_unmeasured_upper_cap():
    """No `<3.x` cap without a measured reason (issue 34); conda asks for the same range."""
    assert project_field("requires-python") == ">=3.10"
    conda = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*- python>=3\.10\s*$", conda, re.M)


def test_an_old_python_is_refused_before_pip_downloads_anything(monkeypatch):
    """pip checks requires-python only after downloading every dependency (on 3.9: torch 2.8
    and 4.9 GB of CUDA libraries). requirements.txt prepares the course's package first, and its
    setup.py stops there with the reason (measured with Python 3.9.18: refused in 2 s)."""
    import runpy
    import sys

    import pytest

    lines = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    assert [ln for ln in lines if ln and not ln.startswith("#")][0] == "-e ."
    monkeypatch.setattr(sys, "version_info", (3, 9, 18, "final", 0))
    with pytest.raises(SystemExit, match="This course needs Python 3.10 or newer"):
        runpy.run_path(str(ROOT / "setup.py"))
