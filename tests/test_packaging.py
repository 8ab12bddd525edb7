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

