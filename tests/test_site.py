"""The course website (course.site): built once per test run from the committed notebooks, then
checked from its HTML and, where Debian's `chromium` is installed, in a real headless browser
over a local server with every other host unreachable.

`SEQ_SITE=build/site pytest tests/test_site.py` checks an existing build instead of building
one; `SEQ_SCREENSHOTS=DIR` keeps the browser test's screenshots there.
"""

import functools
import html
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
from chromium import Browser, find_chromium

from course.notebook_meta import find_exercises
from course.site import definition_name, utils_modules
from utils.show import shown_sources

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MACHINE_PATHS = ("/root/", "/work/", "/home/")
EXTERNAL = re.compile(r"^(https?:|mailto:|javascript:|data:|blob:|about:)")


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    if os.environ.get("SEQ_SITE"):
        return Path(os.environ["SEQ_SITE"]).resolve()
    out = tmp_path_factory.mktemp("site") / "site"
    subprocess.run([sys.executable, "-m", "course.site", "build", "--out", str(out)], cwd=REPO,
                   check=True, timeout=900)
    return out


class Page(HTMLParser):
    """The ids, links and embedded resources of one HTML page."""

    def __init__(self, text: str):
        super().__init__()
        self.ids, self.links, self.resources = set(), [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag in ("img", "script", "iframe", "source") and a.get("src"):
            self.resources.append(a["src"])
        if tag == "link" and a.get("href") and "stylesheet" in (a.get("rel") or "") + " icon":
            self.resources.append(a["href"])


@pytest.fixture(scope="session")
def pages(site) -> dict[Path, Page]:
    skip = ("_static", "reveal.js")
    return {p: Page(p.read_text(encoding="utf-8")) for p in site.rglob("*.html")
            if not any(part in skip for part in p.relative_to(site).parts)}


def _resolve(page: Path, url: str, site: Path) -> tuple[Path, set[str]]:
    """The file a relative URL points to, and the ids its fragment may name (browsers try the
    fragment as written, then percent-decoded)."""
    parts = urlsplit(url)
    target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if target.is_dir():
        target = target / "index.html"
    assert site in target.parents or target == site, f"{url} leaves the site"
    return target, {parts.fragment, unquote(parts.fragment)} - {""}


def test_every_notebook_module_and_deck_has_a_page(site):
    for nb in NOTEBOOKS:
        assert (site / "notebooks" / f"{nb.stem}.html").exists(), nb.name
        assert (site / "slides" / f"{nb.stem}.slides.html").exists(), nb.name
    for module in utils_modules():
        assert (site / "api" / f"{module}.html").exists(), module
    for page in ("index.html", "search.html", "genindex.html", "api/index.html"):
        assert (site / page).exists(), page


def test_every_internal_link_and_resource_resolves(site, pages):
    broken = []
    for path, page in pages.items():
        for url in page.resources:
            if re.match(r"(https?:)?//", url):
                broken.append(f"{path.relative_to(site)}: loads {url} from another host")
        for url in page.links + page.resources:
            if EXTERNAL.match(url) or url.startswith("//") or url == "#":
                continue
            target, fragments = _resolve(path, url, site)
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {url} (no such file)")
            elif fragments and target in pages and not fragments & pages[target].ids:
                broken.append(f"{path.relative_to(site)}: {url} (no such id)")
    assert not broken, "\n".join(broken[:30])


def test_no_error_output_and_no_machine_path(site):
    found = []
    for path in [*site.rglob("*.html"), site / "searchindex.js", *site.glob("_sources/**/*")]:
        if "_static" in path.parts or "reveal.js" in path.parts or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for bad in ("Traceback (most recent call last)", 'class="output traceback',
                    "output error", *MACHINE_PATHS):
            if bad in text:
                found.append(f"{path.relative_to(site)}: {bad!r}")
    assert not found, "\n".join(found)


def test_notebook_pages_link_slides_solutions_and_api(site, pages):
    for nb_path in NOTEBOOKS:
        page = site / "notebooks" / f"{nb_path.stem}.html"
        text = page.read_text(encoding="utf-8")
        assert f"../slides/{nb_path.stem}.slides.html" in pages[page].links
        assert f"../student/{nb_path.name}" in pages[page].links  # the student edition, downloadable
        assert any("/blob/student/notebooks/" in url for url in pages[page].links)  # and in Colab
        nb = nbformat.read(nb_path, as_version=4)
        ex = find_exercises(nb.cells)
        toggles = text.count('<details class="solution">')
        assert toggles == len(ex.groups) > 0, f"{nb_path.name}: {toggles} solution toggles"
        for _, args in shown_sources(nb.cells):
            name = definition_name(*args)
            module = ".".join(name.split(".")[:2])
            assert f"../api/{module}.html#{name}" in pages[page].links, f"{nb_path.name}: {name}"


def test_notebook_pages_leave_out_the_setup_code_and_fold_the_bookkeeping(site):
    """Every page opened with ~40 lines of Colab setup code; now that cell's input is removed
    (myst-nb's `remove-input`, generated by `python -m course meta apply`) and the code that
    records the results sits behind a "Show code cell source" toggle (`hide-input`)."""
    shown = []
    for nb in NOTEBOOKS:
        text = (site / "notebooks" / f"{nb.stem}.html").read_text(encoding="utf-8")
        if "Colab only:" in text or "clone the course, install its requirements" in text:
            shown.append(f"{nb.stem}: the setup code")
        for call in re.finditer(r'<span class="n">save_results</span><span class="p">\(', text):
            start = text.rfind('<div class="cell ', 0, call.start())  # its cell's classes
            if "tag_hide-input" not in text[start:text.index(">", start)]:
                shown.append(f"{nb.stem}: the save_results code, unfolded")
    assert not shown, "\n".join(shown)


def test_landing_page_has_path_run_times_and_results(site):
    text = (site / "index.html").read_text(encoding="utf-8")
    for heading in ("Learning path", "How to run it", "Results"):
        assert heading in text
    # the README's quick start, not a second copy that drifts (its JupyterLab command differed)
    readme, plain = (REPO / "README.md").read_text(), html.unescape(re.sub(r"<[^>]+>", "", text))
    for command in re.findall(r"^\s*((?:jupyter lab|python3 -m venv) .+)$", readme, re.M):
        assert command in plain, command
    for page, title in (("running.html", "Running the course"), ("maintaining.html", "Maintaining the course")):
        assert f'href="{page}"' in text and title in (site / page).read_text(encoding="utf-8")
    for nb in NOTEBOOKS:
        assert f"notebooks/{nb.stem}.html" in text and f"slides/{nb.stem}.slides.html" in text
        result = json.loads((REPO / "notebooks" / "results" / f"{nb.stem}.json").read_text())
        first_metric = next(iter(result["metrics"]))
        assert first_metric in text, f"{nb.stem}: results table"
    # the learning path counts what it lists (it said "Twelve" after the course grew to 13)
    assert f"{len(NOTEBOOKS)} notebooks in teaching order" in text


# ---------------------------------------------------------------------------- in a browser
@pytest.fixture(scope="session")
def browser():
    binary = find_chromium()
    if binary is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    b = Browser(binary)
    yield b
    b.close()


@pytest.fixture(scope="session")
def server(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("SEQ_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _visit(browser, server, page: str) -> None:
    browser.events.clear()
    browser.goto(server + page)
    browser.wait_for("document.readyState === 'complete'")


def _offline_and_clean(browser, server) -> None:
    elsewhere = [u for u in browser.requests()
                 if not u.startswith((server, "data:", "blob:", "about:"))]
    assert not elsewhere, f"requests that left 127.0.0.1: {elsewhere}"
    assert not browser.errors(), browser.errors()


IMAGES_LOADED = "[...document.images].every(i => i.complete && i.naturalWidth > 0)"
MATH_TYPESET = """(() => { const math = [...document.querySelectorAll('.math')];
    return math.length > 0 && math.every(m => m.querySelector('mjx-container')); })()"""


def test_landing_page_in_a_browser(browser, server, shots):
    _visit(browser, server, "index.html")
    assert browser.eval("document.querySelectorAll('table').length") >= 2
    assert browser.eval(IMAGES_LOADED)
    browser.screenshot(shots / "landing.png")
    _offline_and_clean(browser, server)


def test_notebook_page_in_a_browser(browser, server, shots):
    _visit(browser, server, "notebooks/03_recurrent_neural_networks.html")
    browser.wait_for(MATH_TYPESET)
    browser.eval("[...document.images].forEach(i => { i.loading = 'eager'; })")
    browser.wait_for(IMAGES_LOADED)
    assert browser.eval("document.images.length") > 0
    first = "details.solution"
    hidden = f"!document.querySelector('{first} > summary').nextElementSibling.checkVisibility()"
    assert browser.eval(f"!document.querySelector('{first}').open") and browser.eval(hidden)
    browser.click(f"{first} > summary")
    assert browser.eval(f"document.querySelector('{first}').open")
    assert not browser.eval(hidden)
    browser.screenshot(shots / "notebook_solution_open.png")
    browser.click(f"{first} > summary")
    assert browser.eval(f"!document.querySelector('{first}').open") and browser.eval(hidden)
    _offline_and_clean(browser, server)


def test_search_works_offline(browser, server):
    _visit(browser, server, "search.html?q=perplexity")
    browser.wait_for("document.querySelectorAll('#search-results li, ul.search li').length > 0")
    _offline_and_clean(browser, server)


def test_slide_deck_in_a_browser(browser, server, shots):
    _visit(browser, server, "slides/03_recurrent_neural_networks.slides.html")
    browser.wait_for("typeof Reveal !== 'undefined' && Reveal.isReady()")
    browser.wait_for("document.querySelectorAll('mjx-container').length > 0")
    assert browser.eval("Reveal.getTotalSlides()") > 10
    assert browser.eval(IMAGES_LOADED)
    browser.screenshot(shots / "slides_title.png")
    browser.eval("Reveal.next()")
    assert browser.eval("Reveal.getIndices().h + Reveal.getIndices().v") >= 1
    _offline_and_clean(browser, server)


SLIDE_FITS = """(() => { const s = Reveal.getCurrentSlide();
    const frame = document.querySelector('.reveal .slides').getBoundingClientRect();
    return s.scrollHeight <= s.clientHeight + 1 && s.getBoundingClientRect().height <= frame.height + 1; })()"""
LINK_VISIBLE = """(() => { const r = document.querySelector('a.course-home').getBoundingClientRect();
    return r.top >= 0 && r.bottom <= innerHeight && r.height > 0; })()"""


MIN_ZOOM = 0.6  # below it, code on a projected slide is unreadable (deck 07's 9/1 was at 0.38)


def test_every_slide_fits_its_frame_at_a_readable_size_and_the_way_back_is_visible(browser, server):
    """Deck 07 once had 8 of 77 slides taller than the slide (a heatmap cut off, the title
    slide's goals clipped), and the "back to the notebook page" link sat below the viewport
    (its CSS never applied). Then tall slides were shrunk to fit: 8 of 77 in deck 07 (slide 9/1,
    code and two heatmaps, at zoom 0.38: code at about 5 px), 17 of 81 in deck 14 (10/1, the
    results bookkeeping, at 0.16). Every slide of every deck, as a presenter steps through it,
    must fit at zoom 0.6 or more: tall code is split and its output moved to the next slide
    (course.site.fit_cells), bookkeeping is skipped (course.notebook_meta.slide_types)."""
    tall, small = {}, {}
    for path in NOTEBOOKS:
        _visit(browser, server, f"slides/{path.stem}.slides.html")
        browser.wait_for("typeof Reveal !== 'undefined' && Reveal.isReady()")
        browser.eval("MathJax.startup.promise.then(() => true)")  # typeset: the heights are final
        assert browser.eval(LINK_VISIBLE), f"{path.stem}: the link back is not on screen"
        slides = browser.eval("Reveal.getSlides().map(s => [Reveal.getIndices(s).h, Reveal.getIndices(s).v || 0])")
        for h, v in slides:
            browser.eval(f"Reveal.slide({h}, {v})")
            zoom = browser.eval("fitSlide(Reveal.getCurrentSlide()), "
                                "parseFloat(Reveal.getCurrentSlide().style.zoom || '1')")
            if not browser.eval(SLIDE_FITS):
                tall.setdefault(path.stem[:2], []).append((h, v))
            if zoom < MIN_ZOOM:
                small.setdefault(path.stem[:2], []).append((h, v, zoom))
    assert not tall, f"slides (h, v) taller than the frame: {tall}"
    assert not small, f"slides (h, v, zoom) shrunk below {MIN_ZOOM}: {small}"


def test_decks_show_ideas_not_bookkeeping(site):
    """The title slide was a 12-line paragraph, `In [41]:` prompts showed, and the cells that
    record results (with a dump of ~150 metrics in deck 14) had slides of their own. Now the
    title slide holds the title, goals and run time (the summary goes to the speaker notes),
    there are no prompts, and the recording cells are skipped."""
    found = []
    for nb in NOTEBOOKS:
        deck = (site / "slides" / f"{nb.stem}.slides.html").read_text(encoding="utf-8")
        first = deck.split("<section", 2)[2].split("</section>", 1)[0]  # the title slide
        if "Run time" not in first or '<aside class="notes">' not in first:
            found.append(f"{nb.stem}: the title slide lacks the run time or the notes")
        summary = next(p for p in nbformat.read(nb, as_version=4).cells[0].source.split("\n\n")[1:]
                       if not p.startswith(("**", "[", "#")))
        words = " ".join(summary.split()[:4])
        shown = re.sub(r'<aside class="notes">.*?</aside>', "", first, flags=re.S)
        if words in re.sub(r"<[^>]+>", "", shown):
            found.append(f"{nb.stem}: the summary paragraph is on the title slide")
        if re.search(r"In&nbsp;\[|>In \[\d*\]:|>Out\[\d+\]:", deck):
            found.append(f"{nb.stem}: prompts")
        if '<span class="n">save_results</span><span class="p">(' in deck:
            found.append(f"{nb.stem}: the cell that records the results has a slide")
    assert not found, "\n".join(found)


def test_serving_before_a_build_says_to_build_first(tmp_path):
    """`python -m course site serve` with nothing built served 404s without a word."""
    from course.site import main

    with pytest.raises(SystemExit, match=rf"no built site in {re.escape(str(tmp_path))} .*course.site build --out"):
        main(["serve", "--out", str(tmp_path)])


WIDE_BLOCKS = """(() => [...document.querySelectorAll('.cell_input pre, .cell_output pre, .cell_output table')]
    .filter(b => b.scrollWidth > b.clientWidth + 1 || b.getBoundingClientRect().right >
                 document.querySelector('.bd-article').getBoundingClientRect().right + 1)
    .map(b => (b.closest('.cell_input') ? 'code: ' : 'output: ') + b.textContent.trim().slice(0, 60)))()"""


def test_code_outputs_and_tables_fit_the_column_without_scrolling(browser, server):
    """On a 1280-px screen 873 of 1,345 code and output blocks once scrolled sideways in a
    684-px column (the results of notebook 06 hid their last columns). The article now takes
    the right-hand column's width, code is set at 12.5 px (a 120-character line fits, also in a
    solution box), outputs wrap, and results tables are HTML (utils.show.Table);
    tests/test_notebook_meta.py keeps code lines within 120 characters."""
    wide = {}
    for path in NOTEBOOKS:
        _visit(browser, server, f"notebooks/{path.stem}.html")
        if found := browser.eval(WIDE_BLOCKS):
            wide[path.stem[:2]] = found
    assert not wide, f"blocks that scroll sideways or leave the column: {wide}"


PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}
PAGE_FITS = "document.documentElement.scrollWidth <= innerWidth + 1"
TABLE_CUES = """[...document.querySelectorAll('.bd-article table')].map(t => {
    const cue = t.closest('.scroll-cue'), box = cue && cue.firstElementChild;
    const wide = !!box && box.scrollWidth > box.clientWidth + 1;
    const note = cue && cue.previousElementSibling;
    return {text: t.textContent.trim().slice(0, 40), boxed: !!box, wide,
            noted: wide && note.classList.contains('scroll-note') && note.checkVisibility(),
            shaded: wide && cue.classList.contains('scrolls')
                    && getComputedStyle(cue, '::after').content !== 'none'};
  }).filter(t => !t.boxed || (t.wide && !(t.noted && t.shaded)))"""
SHRUNK_FIGURES = """[...document.querySelectorAll('.bd-article .cell_output img')]
  .filter(i => i.getBoundingClientRect().width + 1 < i.naturalWidth)
  .filter(i => { const a = i.closest('a.figure-full'); return !a || a.href !== i.src; })
  .map(i => i.getAttribute('src'))"""


def test_every_page_fits_a_phone(browser, server, shots):
    """At 390 px the landing page's learning path lost its right columns with no sign that it
    scrolls, notebook 14's page was 431 px wide (inline code did not wrap) and figures shrank
    to 358 px with illegible axes. Now, on every notebook page, the landing page and the two
    course pages: no page is wider than the screen, a table wider than the column scrolls in its
    own box with a note and a shaded edge, and a shrunk figure opens at full size when tapped."""
    browser.send("Emulation.setDeviceMetricsOverride", **PHONE)
    problems = {}
    try:
        for page in ["index.html", "running.html", "maintaining.html",
                     *(f"notebooks/{p.stem}.html" for p in NOTEBOOKS)]:
            _visit(browser, server, page)
            browser.eval("[...document.images].forEach(i => { i.loading = 'eager'; })")
            browser.wait_for(IMAGES_LOADED)
            found = []
            if not browser.eval(PAGE_FITS):
                found.append(f"{browser.eval('document.documentElement.scrollWidth')} px wide")
            found += [f"table without a cue: {t['text']!r}" for t in browser.eval(TABLE_CUES)]
            found += [f"figure without a full-size link: {src}" for src in browser.eval(SHRUNK_FIGURES)]
            if found:
                problems[page] = found
            if page in ("index.html", "notebooks/14_taming_the_transformer.html"):
                browser.screenshot(shots / f"{Path(page).stem}_390.png")
        _visit(browser, server, "index.html")  # the cue goes once the table is scrolled to its end
        browser.eval("document.querySelector('.scroll-cue').firstElementChild.scrollLeft = 1e5")
        time.sleep(0.3)
        assert not browser.eval("document.querySelector('.scroll-cue').classList.contains('scrolls')")
    finally:
        browser.send("Emulation.clearDeviceMetricsOverride")
    assert not problems, problems
