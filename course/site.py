"""The course website and slide decks, built offline from the committed notebooks.

`python -m course site build [--out DIR]` renders, without executing anything, into
`build/site/` (git-ignored):
- a landing page: what the course teaches, the learning path 01 -> 14 with prerequisites and
  run times (what each teaches from site/learning_path.md), the README's quick start, the
  results table;
- the pages "Running the course" and "Maintaining the course" (site/running.md and
  site/maintaining.md, readable on GitHub too; the README links to them);
- one page per notebook with its stored outputs and figures; solutions sit behind "Show the
  solution" toggles, and every `show_source(...)` cell links to that definition's API entry;
- one API page per `utils` module (autodoc, with the highlighted source one click away);
- one reveal.js slide deck per notebook (`slides/NN_topic.slides.html`), linked from its page.

Search, math, highlighting and previous/next navigation come from Sphinx, myst-nb and
sphinx-book-theme. MathJax and reveal.js are copied into the site from two PyPI packages
(sphinx-mathjax-offline, sphinx-revealjs), so no page loads anything from another host.
`python -m course site serve [--port N]` serves the built site on http://127.0.0.1:N/.
"""

from __future__ import annotations

import html
import importlib.metadata
import importlib.util
import inspect
import json
import re
import shutil
import sys
import time
from pathlib import Path

from docutils import nodes

from course.notebook_meta import (
    SOLUTION_TAG,
    duration,
    find_exercises,
    notebook_paths,
    write_student_edition,
)
from course.notebooks import STUDENT_BRANCH, colab_url

REPO_ROOT = Path(__file__).resolve().parent.parent
SITE_DIR = REPO_ROOT / "site"  # Sphinx configuration, CSS, the slide template
OUT = REPO_ROOT / "build" / "site"  # next to it: site-src (generated sources), site-doctrees
RESULTS = REPO_ROOT / "notebooks" / "results"
NBVAL_MARKER = "# NBVAL_CHECK_OUTPUT"
COLAB_BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\(([^)]*)\)")


def mathjax_dir() -> Path:
    """The folder holding `mathjax/` (MathJax 3) in the sphinx-mathjax-offline package."""
    dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    return Path(dist.locate_file("sphinx-mathjax-offline/static"))


def reveal_dir() -> Path:
    """reveal.js (dist/ and plugin/) as shipped inside the sphinx-revealjs package."""
    return Path(importlib.util.find_spec("sphinx_revealjs").origin).parent / "_static" / "revealjs"


def utils_modules() -> list[str]:
    return sorted(f"utils.{p.stem}" for p in (REPO_ROOT / "utils").glob("*.py")
                  if p.stem != "__init__")


def _write(path: Path, text: str) -> None:
    """Write only when the text changed, so Sphinx rebuilds only what changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# ---------------------------------------------------------------------------- notebook pages
def definition_name(obj, member: str | None = None) -> str:
    """Dotted name of the definition `show_source(obj, member)` shows (where it is defined)."""
    target = getattr(obj, member) if member else obj
    target = inspect.unwrap(getattr(target, "__func__", target))
    return f"{target.__module__}.{target.__qualname__}"


def _offline_badge(source: str, name: str) -> str:
    """The Colab badge is an image on another host: the site shows plain links instead."""
    student = colab_url(name + ".ipynb", STUDENT_BRANCH)  # solutions blanked: `python -m course student`
    links = (f'<a class="course-button" href="{{url}}">Open in Colab</a> '
             f'<a class="course-button" href="../slides/{name}.slides.html">Slides</a> '
             f'<a class="course-button" href="{student}">Student edition in Colab</a> '
             f'<a class="course-button" href="../student/{name}.ipynb" download>Student edition (.ipynb)</a>')
    new, n = COLAB_BADGE.subn(lambda m: links.format(url=m.group(1)), source)
    return new if n else f'{source}\n\n{links.format(url=colab_url(name + ".ipynb"))}'


def _drop_test_markers(nb) -> None:
    """`# NBVAL_CHECK_OUTPUT` tells the test suite to compare a cell's output; readers and
    audiences do not need it."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and cell["source"].startswith(NBVAL_MARKER):
            cell["source"] = cell["source"][len(NBVAL_MARKER):].lstrip("\n")


def notebook_page(nb, name: str):
    """The copy of a notebook that Sphinx renders: offline badge and slide link, a link to the
    API entry under every shown source, solution cells marked for the toggles."""
    import nbformat

    from utils.show import shown_sources

    nb = nbformat.from_dict(json.loads(json.dumps(nb)))  # a deep copy
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    first.source = _offline_badge(first.source, name)
    links = {}
    for cell, args in shown_sources(nb.cells):
        target = definition_name(*args)
        module = target.split(".")[0] + "." + target.split(".")[1]
        links[id(cell)] = nbformat.v4.new_markdown_cell(
            f'<p class="api-link">Defined in <a href="../api/{module}.html#{target}">'
            f"<code>{html.escape(target)}</code></a> (API reference)</p>")
    ex = find_exercises(nb.cells)
    starts = {cells[0]: k for k, cells in ex.groups.items()} if ex else {}
    _drop_test_markers(nb)
    cells = []
    for i, cell in enumerate(nb.cells):
        if SOLUTION_TAG in cell.metadata.get("tags", []):
            label = f"solution-start-{starts[i] or 0}" if i in starts else ""
            if cell.cell_type == "code":
                cell.metadata["tags"] = [*cell.metadata["tags"], *([label] if label else [])]
            else:
                cell.source = (f"`````{{container}} tag-solution {label}\n{cell.source}\n`````")
        cells.append(cell)
        if id(cell) in links:
            cells.append(links[id(cell)])
    # the page's sections under its title (the site has no right-hand column: code gets the width)
    cells.insert(cells.index(first) + 1, nbformat.v4.new_markdown_cell(
        "```{contents} On this page\n:local:\n:depth: 1\n:class: page-contents\n```"))
    for n, cell in enumerate(cells):
        cell["id"] = f"c{n}"  # unique after the insertions
    nb.cells = cells
    return nb


# ---------------------------------------------------------------------------- the landing page
def _readme_rows() -> dict[str, tuple[str, str]]:
    """(short title, what it teaches) per notebook number: the title from the README's notebook
    table, what it teaches in full from site/learning_path.md (the README's column is short)."""
    titles, teaches = {}, {}
    for line in (REPO_ROOT / "README.md").read_text().splitlines():
        m = re.match(r"\| (\d\d) \| \[([^\]]+)\]\(notebooks/[^)]+\) \| (.+?) \|", line)
        if m:
            titles[m.group(1)], teaches[m.group(1)] = m.group(2), m.group(3)
    for line in (SITE_DIR / "learning_path.md").read_text().splitlines():
        m = re.match(r"\| (\d\d) \| \[[^\]]+\]\([^)]+\) \| (.+?) \| (.+?) \|$", line)
        if m:
            teaches[m.group(1)] = m.group(2)
    return {n: (title, teaches[n]) for n, title in titles.items()}


def _header(nb) -> tuple[str, str]:
    """(title, prerequisites) from a notebook's first cell."""
    first = nb.cells[0].source
    title = first.splitlines()[0].lstrip("# ").split("·", 1)[-1].strip()
    prereq = next((p for p in first.split("\n\n") if p.startswith("**Prerequisites:**")), "")
    return title, " ".join(prereq.removeprefix("**Prerequisites:**").split())


def _builds_on(prerequisites: str, number: int) -> list[str]:
    found = {n for n in re.findall(r"\b(0[1-9]|1[0-9])\b", prerequisites) if int(n) < number}
    return sorted(found)


def _results_table(gpu: bool = False) -> str:
    """The README's results table (or its GPU table), with links that work on the site."""
    from course.results import render_gpu_table, render_table

    table = render_gpu_table() if gpu else render_table()
    table = re.sub(r"\[([^\]]+)\]\((?:\.\./)?notebooks/results/([^)]+)\)", r'<a href="results/\2">\1</a>',
                   table)
    table = re.sub(r"(\| |<br>)([a-z][a-z0-9_]*) = ", r"\1<code>\2</code> = ", table)  # record keys
    table = re.sub(r"(\d{4}-\d\d-\d\d|\d+\.\d min(?: \(\d+\.\d min\))?)(?= \|)",
                   r'<span class="nowrap">\1</span>', table)  # dates and run times on one line
    return re.sub(r"^\| (\d\d_[a-z0-9_]+) \|", r"| [\1](notebooks/\1.ipynb) |", table, flags=re.M)


PAGES = {"running": "Running the course", "maintaining": "Maintaining the course"}  # site/NAME.md


def _site_links(text: str) -> str:
    """Markdown written for GitHub (the README, site/*.md) with links that work on the site:
    pages and notebooks as documents, other repository files on GitHub."""
    from course.notebooks import BRANCH, REPO_URL

    text = re.sub(r"\]\((?:\.\./)?site/([a-z_]+)\.md", r"](\1.md", text)
    text = re.sub(r"\]\((?:\.\./)?notebooks/(\d\d_[a-z0-9_]+)\.ipynb\)", r"](notebooks/\1.ipynb)", text)
    return re.sub(r"\]\(\.\./(?!notebooks/\d)([^)#]+)", rf"]({REPO_URL}/blob/{BRANCH}/\1", text)


def readme_section(heading: str) -> str:
    """The README's section `## heading`, without its heading, links made to work on the site."""
    readme = (REPO_ROOT / "README.md").read_text()
    body = readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return _site_links(body.strip())


def site_page(name: str) -> str:
    """site/NAME.md as a page of the site: the GPU table's links lead to the site's copies of
    the records, links to the repository's other files to GitHub."""
    from course.results import GPU_END, GPU_START

    text = (SITE_DIR / f"{name}.md").read_text()
    if GPU_START in text:
        head, rest = text.split(GPU_START, 1)
        text = f"{head}{GPU_START}\n{_results_table(gpu=True)}\n{GPU_END}{rest.split(GPU_END, 1)[1]}"
    return _site_links(text)


def landing_page(paths: list[Path]) -> str:
    import nbformat

    readme = (REPO_ROOT / "README.md").read_text()
    intro = readme.split("\n\n")[1] if "\n\n" in readme else ""
    teaches, names = _readme_rows(), {p.stem[:2]: p.stem for p in paths}
    rows = ["| # | notebook: what it teaches | builds on | full run | slides |",
            "|---|---|---|---|---|"]
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        number, (title, prereq) = path.stem[:2], _header(nb)
        after = ", ".join(f"[{n}](notebooks/{names[n]}.ipynb)" for n in
                          _builds_on(prereq, int(number)) if n in names) or "-"
        result = RESULTS / f"{path.stem}.json"
        run = duration(json.loads(result.read_text())["wall_time_s"]) if result.exists() else "-"
        short, what = teaches.get(number, (title, ""))
        rows.append(f"| {number} | **[{short}](notebooks/{path.stem}.ipynb)**: {what} | "
                    f"{after} | {run} | "
                    f'<a href="slides/{path.stem}.slides.html">slides</a> |')
    # the sidebar names each notebook as the README's table does, not by its long first heading
    toc = "\n".join(f"{p.stem[:2]} · {teaches.get(p.stem[:2], (p.stem, ''))[0]} <notebooks/{p.stem}>"
                    for p in paths)
    pages = "\n".join(f"{title} <{name}>" for name, title in PAGES.items())
    return f"""# Sequence Models, from RNNs to Transformers

{intro}

## Learning path

{len(paths)} notebooks in teaching order. Each one lists what it builds on; "full run" is the
wall time of the committed run (full mode, CPU), from `notebooks/results/`.

{chr(10).join(rows)}

## How to run it

{readme_section("Quick start")}

## Results

Headline numbers of each notebook's last full run (`notebooks/results/*.json`; full runs on a
GPU: [Running the course](running.md#the-same-notebooks-on-a-gpu)):

{_results_table()}

```{{toctree}}
:hidden:
:caption: Notebooks

{toc}
```

```{{toctree}}
:hidden:
:caption: The course

{pages}
api/index
```
"""


# ---------------------------------------------------------------------------- API pages
def _shown_names(paths: list[Path]) -> dict[str, set[str]]:
    """Per module, the private and special member names some notebook shows."""
    import nbformat

    from utils.show import shown_sources

    names: dict[str, set[str]] = {}
    for path in paths:
        for _, args in shown_sources(nbformat.read(path, as_version=4).cells):
            module, *parts = definition_name(*args).split(".", 2)[1:]
            for part in ".".join(parts).split("."):
                if part.startswith("_"):
                    names.setdefault(f"utils.{module}", set()).add(part)
    return names


def api_page(module: str, shown: set[str]) -> str:
    private = sorted(n for n in shown if not n.startswith("__"))
    special = sorted(n for n in shown if n.startswith("__"))
    options = "".join(f"   :{opt}: {', '.join(names)}\n" for opt, names in
                      (("private-members", private), ("special-members", special)) if names)
    path = module.replace(".", "/")
    return f"""# `{module}`

Source: <a href="../_modules/{path}.html"><code>{path}.py</code></a>, highlighted; each
entry below links to its own lines (*[source]*).

```{{eval-rst}}
.. automodule:: {module}
   :members:
   :undoc-members:
   :show-inheritance:
{options}```
"""


def api_index(modules: list[str]) -> str:
    import utils

    doc = inspect.getdoc(utils) or ""
    doc = re.sub(r"`(utils\.\w+)`", lambda m: f"[`{m.group(1)}`]({m.group(1)}.md)"
                 if m.group(1) in modules else m.group(0), doc)
    body = doc.split("\n", 1)[1] if "\n" in doc else ""
    toc = "\n".join(modules)
    return f"""# API reference: `utils`

{body.strip()}

```{{toctree}}
:hidden:

{toc}
```
"""


# ---------------------------------------------------------------------------- build
def prepare(src: Path, paths: list[Path] | None = None) -> None:
    """Write the Sphinx sources: landing page, notebook copies, API pages."""
    import nbformat

    paths = paths or notebook_paths([])
    wanted = {src / "index.md", src / "api" / "index.md"}
    _write(src / "index.md", landing_page(paths))
    for name in PAGES:
        _write(src / f"{name}.md", site_page(name))
        wanted.add(src / f"{name}.md")
    for path in paths:
        page = notebook_page(nbformat.read(path, as_version=4), path.stem)
        target = src / "notebooks" / path.name
        _write(target, nbformat.writes(page) + "\n")
        wanted.add(target)
    modules, shown = utils_modules(), _shown_names(paths)
    _write(src / "api" / "index.md", api_index(modules))
    for module in modules:
        _write(src / "api" / f"{module}.md", api_page(module, shown.get(module, set())))
        wanted.add(src / "api" / f"{module}.md")
    for stale in [p for p in src.rglob("*") if p.is_file() and p not in wanted]:
        stale.unlink()


DECK_LINES = 34  # content lines a slide shows at zoom 0.6 or more (24 fill it at zoom 1)


def _cell(cell_type: str, source: str, kind: str, outputs=None, tags=()) -> dict:
    cell = {"cell_type": cell_type, "source": source, "metadata": {"slideshow": {"slide_type": kind}}}
    if tags:
        cell["metadata"]["tags"] = list(tags)
    if cell_type == "code":
        cell.update(outputs=outputs or [], execution_count=None)
    return cell


def title_slide(first: dict) -> list[dict]:
    """The notebook's header as a title slide (title, learning goals, run time, Colab link)
    and speaker notes (the summary paragraph, the prerequisites)."""
    from course.notebook_meta import RUN_TIME

    source = COLAB_BADGE.sub(r'<a href="\1">Open in Colab</a>', first["source"])
    keep, notes = [], []
    for para in source.split("\n\n"):
        shown = (para.startswith("#") or RUN_TIME.match(para) or "Open in Colab" in para
                 or (para.startswith("**") and "\n- " in para))
        (keep if shown else notes).append(para)
    title = {**first, "source": "\n\n".join(keep)}
    return [title] + ([_cell("markdown", "\n\n".join(notes), "notes")] if notes else [])


def _source_chunks(source: str, limit: int) -> list[str]:
    """Code cut at top-level blank lines into pieces of at most `limit` lines where it can be."""
    from course.notebook_meta import _text_lines

    pieces, current = [], []
    for block in re.split(r"\n\s*\n(?=\S)", source):
        if current and _text_lines("\n\n".join([*current, block])) > limit:
            pieces.append("\n\n".join(current))
            current = []
        current.append(block)
    return pieces + ["\n\n".join(current)]


def fit_cells(cells: list[dict], limit: int = DECK_LINES) -> list[dict]:
    """Code cells too tall for one slide at a readable size: long code is cut at blank lines
    and the outputs go to the next slide(s) (an output-only cell, its empty input hidden)."""
    from course.notebook_meta import _text_lines, cell_height, output_height

    out = []
    for cell in cells:
        kind = cell["metadata"].get("slideshow", {}).get("slide_type", "-")
        if cell["cell_type"] != "code" or kind in ("skip", "notes") or cell_height(cell) <= limit:
            out.append(cell)
            continue
        chunks = _source_chunks(cell["source"], limit)
        outputs = cell.get("outputs", [])
        for n, chunk in enumerate(chunks):
            piece = {**cell, "source": chunk, "outputs": []}
            if n:
                piece["metadata"] = {**cell["metadata"], "slideshow": {"slide_type": "subslide"}}
            out.append(piece)
        room = limit - _text_lines(chunks[-1]) - 1
        if sum(output_height(o) for o in outputs) <= room:
            out[-1]["outputs"] = outputs
            continue
        group, used = [], 0
        for o in outputs:  # the outputs on the next slides, as many per slide as fit
            if group and used + output_height(o) > limit:
                out.append(_cell("code", "", "subslide", group, ["output-only"]))
                group, used = [], 0
            group.append(o)
            used += output_height(o)
        if group:
            out.append(_cell("code", "", "subslide", group, ["output-only"]))
    return out


def slide_deck(nb, name: str, exporter) -> str:
    """One notebook as a reveal.js deck (HTML): the header as a title slide with notes, the
    Colab badge a plain link, cells too tall for a slide split (`fit_cells`)."""
    import nbformat

    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        cell["source"] = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    at = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown")
    nb["cells"][at:at + 1] = title_slide(nb["cells"][at])
    _drop_test_markers(nb)
    nb["cells"] = fit_cells(nb["cells"])
    for n, cell in enumerate(nb["cells"]):
        cell["id"] = f"d{n}"  # unique after the splits
    body, _ = exporter.from_notebook_node(
        nbformat.from_dict(nb),
        resources={"page_url": f"../notebooks/{name}.html", "metadata": {"name": name}})
    return body


def build_slides(paths: list[Path], dest: Path) -> None:
    """One reveal.js deck per notebook, with reveal.js copied next to them."""
    import nbformat
    from nbconvert import SlidesExporter

    reveal, target = reveal_dir(), dest / "reveal.js"
    for part in ("LICENSE", "dist/reveal.js", "dist/reveal.css", "dist/reset.css",
                 "dist/theme/white.css", "dist/theme/fonts/source-sans-pro",
                 "plugin/notes/notes.js"):
        (target / part).parent.mkdir(parents=True, exist_ok=True)
        if (reveal / part).is_dir():
            shutil.copytree(reveal / part, target / part, dirs_exist_ok=True)
        else:
            shutil.copy2(reveal / part, target / part)
    exporter = SlidesExporter(extra_template_basedirs=[str(SITE_DIR)], template_name="slides",
                              reveal_url_prefix="reveal.js", reveal_theme="white",
                              mathjax_url="../_static/mathjax/tex-chtml.js",
                              exclude_input_prompt=True, exclude_output_prompt=True)  # no "In [41]:"
    exporter.log.setLevel("ERROR")  # not "alternative text is missing" for every plot
    for path in paths:
        deck = slide_deck(nbformat.read(path, as_version=4), path.stem, exporter)
        _write(dest / f"{path.stem}.slides.html", deck)


def build(out: Path = OUT, quiet: bool = True) -> float:
    """Build the whole site into `out` (sources and Sphinx's cache go next to it, in
    `OUT-src` and `OUT-doctrees`); returns the seconds it took."""
    from sphinx.cmd.build import build_main

    start, paths = time.perf_counter(), notebook_paths([])
    src, doctrees = out.parent / f"{out.name}-src", out.parent / f"{out.name}-doctrees"
    prepare(src, paths)
    args = ["-b", "html", "-E", "-c", str(SITE_DIR), "-d", str(doctrees), str(src), str(out)]
    if build_main((["-q"] if quiet else []) + args):
        raise SystemExit("sphinx-build failed (see above)")
    build_slides(paths, out / "slides")
    write_student_edition(paths, out / "student")  # the pages' download links
    (out / "results").mkdir(exist_ok=True)
    for result in [*RESULTS.glob("*.json"), *RESULTS.glob("gpu/*.json")]:
        target = out / "results" / result.relative_to(RESULTS)
        target.parent.mkdir(exist_ok=True)
        shutil.copy2(result, target)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- Sphinx extension
class solution(nodes.General, nodes.Element):
    """Solution cells behind a toggle: <details><summary>Show the solution</summary>..."""


def _visit_solution(self, node) -> None:
    self.body.append(f'<details class="solution"><summary>{html.escape(node["label"])}'
                     "</summary>\n")


def _depart_solution(self, node) -> None:
    self.body.append("</details>\n")


def _solution_start(node) -> str | None:
    """The toggle label if `node` is a solution cell (None otherwise; "" if it continues one)."""
    classes = [c.replace("_", "-") for c in node.get("classes", [])]
    if "tag-solution" not in classes:
        return None
    start = next((c for c in classes if c.startswith("tag-solution-start-")
                  or c.startswith("solution-start-")), None)
    if start is None:
        return ""
    k = start.rsplit("-", 1)[1]
    return f"Show the solution of exercise {k}" if k != "0" else "Show the solution"


def wrap_solutions(app, doctree, docname) -> None:
    """Group consecutive solution cells, one toggle per exercise."""
    for parent in list(doctree.findall(nodes.Element)):
        if not any(isinstance(c, nodes.Element) and _solution_start(c) is not None
                   for c in parent.children):
            continue
        new, group = [], None
        for child in list(parent.children):
            label = _solution_start(child) if isinstance(child, nodes.Element) else None
            if label is None:
                group = None
                new.append(child)
                continue
            if group is None or label:
                group = solution(label=label or "Show the solution")
                new.append(group)
            group.append(child)
        parent.children = []
        parent.extend(new)


def docstring_as_text(app, what, name, obj, options, lines) -> None:
    """Show docstrings as written: they are plain text with equations and ASCII diagrams,
    not reStructuredText, so they become preformatted blocks."""
    if lines:
        lines[:] = [".. code-block:: text", "   :class: docstring", "",
                    *(f"   {line}" for line in lines), ""]


def setup(app):
    """Sphinx extension (site/conf.py loads it): solution toggles, plain-text docstrings."""
    app.add_node(solution, html=(_visit_solution, _depart_solution))
    app.connect("doctree-resolved", wrap_solutions)
    app.connect("autodoc-process-docstring", docstring_as_text)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ---------------------------------------------------------------------------- command line
def serve(out: Path = OUT, port: int = 8000) -> None:
    import functools
    import http.server

    if not (out / "index.html").exists():  # else every page would be a silent 404
        raise SystemExit(f"no built site in {out} (no index.html): run `python -m course site build"
                         + (f" --out {out}" if out != OUT else "") + "` first")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"serving {out} on http://127.0.0.1:{port}/ (Ctrl-C stops)")
        httpd.serve_forever()


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course site", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("build", "serve"))
    parser.add_argument("--out", type=Path, default=OUT, help="the built site (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="serve: port on 127.0.0.1")
    parser.add_argument("--verbose", action="store_true", help="build: show Sphinx's progress")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.out.resolve(), args.port)
        return 0
    seconds = build(args.out.resolve(), quiet=not args.verbose)
    print(f"site built in {seconds:.0f} s: {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
