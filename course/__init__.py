"""The course machinery: what builds, runs, checks and publishes the notebooks, kept apart from
`utils`, the library the notebooks teach and import (as d2l keeps its book tooling apart).

- `course.notebooks`: repository URL, Colab badge and setup cell (`colab_install`), the runner
- `course.results`: the README results tables; the check that recorded reads are current
- `course.notebook_meta`: generated notebook structure (solution tags, slides, run-time lines)
  and the student edition
- `course.site`: the course website and slide decks, built offline from the committed notebooks
- `course.devicecheck`: the test run's GPU stand-in that flags tensors left off `run.device`

One command line for all of it: `python -m course --help`.
"""
