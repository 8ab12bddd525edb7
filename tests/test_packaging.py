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


def test_the_quick_start_installs_the_cpu_wheel_first_and_names_the_same_python_everywhere():
    """`pip install -r requirements.txt` alone pulls PyPI's CUDA torch (several GB) on a Linux
    laptop: the CPU path installs the CPU wheel first; README and site say the same floor."""
    from utils.site import RUNNING

    readme = (ROOT / "README.md").read_text()
    cpu = [ln for ln in readme.splitlines() if "download.pytorch.org/whl/cpu" in ln and "requirements.txt" in ln]
    assert len(cpu) == 1 and cpu[0].index("whl/cpu") < cpu[0].index("-r requirements.txt")
    assert any(ln.startswith("python3 -m venv") and "whl/cpu" not in ln and "requirements.txt" in ln
               for ln in readme.splitlines()), "the GPU path: PyPI's default torch"
    assert RUNNING.index("whl/cpu") < RUNNING.index("-r requirements.txt")
    floor = project_field("requires-python").removeprefix(">=")
    assert f"Python {floor} or newer" in readme and f"Python {floor} or newer" in RUNNING


def test_citation_file_agrees_with_the_package_and_the_repository():
    """CITATION.cff (validated with `cffconvert --validate` when written) names the same
    repository as utils.course.REPO_URL, the package's version and its license."""
    from utils.course import REPO_URL

    cff = (ROOT / "CITATION.cff").read_text()
    field = lambda name: re.search(rf'^{name}: "?([^"\n]*)"?$', cff, re.M)[1]  # noqa: E731
    assert field("cff-version") == "1.2.0" and field("repository-code") == REPO_URL
    assert field("version") == project_field("version") and field("license") == project_field("license")


def test_sync_rewrites_the_citations_repository(tmp_path, monkeypatch):
    from utils import course

    citation = tmp_path / "CITATION.cff"
    citation.write_text((ROOT / "CITATION.cff").read_text())
    monkeypatch.setattr(course, "REPO_URL", "https://github.com/a-fork/sequence-models")
    course.sync_citation(citation)
    assert 'repository-code: "https://github.com/a-fork/sequence-models"' in citation.read_text()
