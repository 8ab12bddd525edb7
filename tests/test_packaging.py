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
