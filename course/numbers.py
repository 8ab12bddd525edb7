"""Every number a notebook's prose states must trace to that notebook's own run.

A sentence such as "the GRU ends 0.061 nats below the RNN" is only true while some output of
the same notebook (or its results file) shows 0.061. Numbers computed in the writer's head,
read off a plot or left from an earlier run go stale silently; this module finds them.

What is checked: every decimal number in the markdown of a notebook (outside math, inline code,
links and solution cells), and every integer followed by a unit of time or training length
(`213 s`, `2,000 updates`). Each must equal, at its printed precision, a number the notebook's
outputs or code show, or its results file holds; as a share, a percentage of it counts too
(0.081 is 8.1 points), and minutes may state a number of seconds. References (equation,
section, figure and table numbers, versions) are recognised by the word before them; numbers
quoted from the literature are listed per notebook, with their source, in
`tests/quoted_numbers.json`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$|\\\(.*?\\\)|\\\[.*?\\\]", re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK_OR_TAG = re.compile(r"\]\([^)]*\)|https?://\S+|<[^>\n]+>")
GENERATED_LINE = re.compile(r"^\*\*Run time:\*\*.*$", re.M)  # written from the results file
NUMBER_LIST = r"\(?\d+(?:\.\d+)*[a-z]?\)?(?:\s*(?:[-–—,]|and|to)\s*\(?\d+(?:\.\d+)*[a-z]?\)?)*"
REFERENCE = re.compile(
    r"(?:\b(?:eqs?|equations?|sections?|chapters?|figs?|figures?|tables?|algorithms?|appendix|"
    r"lemma|theorem|python|torch|transformers|version|v|arxiv)\b\.?:?\s*|§\s*)" + NUMBER_LIST, re.I)
_AMOUNT = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
DECIMAL = re.compile(rf"(?<![\w.,])[-−+]?{_AMOUNT}\.\d+(?:[eE][-−+]?\d+)?(?:%|[kMB]\b)?(?![\w]|\.\d)")
WITH_UNIT = re.compile(rf"(?<![\w.,]){_AMOUNT}(?=\s*(?:s|seconds|updates|steps)\b)")
ANY_NUMBER = re.compile(r"(?<![\w.])[-−+]?(?:\d{1,3}(?:,\d{3})+|\d*\.\d+|\d+)(?:[eE][-−+]?\d+)?(?:[kMB]\b)?")


SUFFIX = {"k": 1e3, "M": 1e6, "B": 1e9}  # 10.7M parameters


def parse_number(token: str) -> tuple[float, float, int]:
    """A printed number -> (value, half a unit in its last printed digit, significant digits
    printed: 2 for "0.24", 1 for "0.07" and "3"; a printed zero counts its decimals, 2 for "0.00").
    Reads thousands commas, a minus sign, an exponent, "%" and a k/M/B suffix ("10.7M")."""
    token = token.replace("−", "-").replace(",", "")
    scale = 0.01 if token.endswith("%") else 1.0
    token = token.rstrip("%")
    if token[-1:] in SUFFIX:
        scale, token = scale * SUFFIX[token[-1]], token[:-1]
    mantissa, _, exponent = token.lower().partition("e")
    scale *= 10.0 ** int(exponent or 0)
    whole, _, decimals = mantissa.lstrip("+-").partition(".")
    significant = (whole + decimals).lstrip("0")  # from the first non-zero digit
    digits = len(significant) if significant else max(len(decimals), 1)
    return float(mantissa) * scale, 0.5 * 10.0 ** -len(decimals) * scale, digits


def agrees(value: float, token: str) -> bool:
    """Does `value`, rounded as `token` was printed, give `token`?"""
    x, tol, _ = parse_number(token)
    return abs(value - x) <= tol * (1 + 1e-9) + 1e-12 * abs(x)


def prose_text(cell: dict) -> str:
    """A markdown cell's prose: no math, inline code, links, HTML tags or generated lines."""
    text = "".join(cell["source"])
    for pattern in (GENERATED_LINE, MATH, CODE_SPAN, LINK_OR_TAG, REFERENCE):
        text = pattern.sub(" ", text)
    return text


def stated_numbers(notebook: dict) -> list[tuple[int, str, str]]:
    """(cell index, the number as written, its context) for every number the prose states."""
    found = []
    for i, cell in enumerate(notebook["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "markdown" or "solution" in tags:
            continue
        text = prose_text(cell)
        for match in [*DECIMAL.finditer(text), *WITH_UNIT.finditer(text)]:
            context = " ".join(text[max(0, match.start() - 50):match.end() + 20].split())
            found.append((i, match.group(), context))
    return found


def shown_numbers(notebook: dict, record: dict | None) -> list[float]:
    """Every number the notebook's outputs and code show, and its results file holds."""
    parts = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        parts.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts += ["".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    values = [parse_number(t)[0] for t in ANY_NUMBER.findall("\n".join(parts))]

    def walk(node):
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            values.append(float(node))

    walk(record or {})
    return values


def traces(token: str, shown: list[float]) -> bool:
    """Does some shown number give `token` when rounded as `token` is written (as itself, as a
    percentage of a share, or seconds as minutes; the sign aside: a gap is stated unsigned)?"""
    unsigned = token.replace("−", "-").lstrip("+-").rstrip("%")
    return any(agrees(abs(y) * factor, unsigned) for y in shown for factor in (1.0, 100.0, 1 / 60))


def untraced(stem: str, quoted: dict[str, str] | None = None, notebooks: Path = NOTEBOOKS
             ) -> list[tuple[int, str, str]]:
    """The prose numbers of notebook `stem` that trace to nothing it shows (nor to the
    literature list `quoted`: number as written -> source)."""
    notebook = json.loads((notebooks / f"{stem}.ipynb").read_text(encoding="utf-8"))
    path = notebooks / "results" / f"{stem}.json"
    shown = shown_numbers(notebook, json.loads(path.read_text()) if path.exists() else None)
    quoted = quoted or {}
    return [(i, token, context) for i, token, context in stated_numbers(notebook)
            if token.lstrip("+-−") not in quoted and not traces(token, shown)]
