"""Show the code a notebook teaches: one `utils` definition at a time, syntax-highlighted.

`python -m utils.show NB...` re-renders the stored output of every `show_source(...)` cell from
the code as it is now, without executing the notebook (a test fails when one is stale).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import textwrap
from pathlib import Path

SHOW_CALL = re.compile(r"show_source\([^\n]*\)(\s*#[^\n]*)?")


def source_of(obj, member: str | None = None) -> str:
    """The source of one function, class or method (`member` names a method of the class `obj`)."""
    target = getattr(obj, member) if member else obj
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (TypeError, OSError) as err:
        raise TypeError(f"cannot show the source of {target!r}: pass a function, class or method "
                        "defined in a .py file") from err


def show_source(obj, member: str | None = None):
    """Render the source of `obj` (or of its method `member`) as highlighted Python.

    In a notebook the returned object displays as a code block; elsewhere `str()` gives the text.
    Use it for one definition at a time, then walk through it in prose.
    """
    from IPython.display import Code  # local import: only notebooks need IPython

    return Code(source_of(obj, member), language="python")


# ---------------------------------------------------------------------------- stored outputs
def utils_namespace(cells: list[dict]) -> dict:
    """The names a notebook imports from utils (its own `from utils... import` statements)."""
    ns: dict = {}
    for cell in cells:
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:  # cells with IPython magics
            continue
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)
                   and (n.module or "").split(".")[0] == "utils"]
        exec(compile(ast.Module(imports, type_ignores=[]), "<imports>", "exec"), ns)
    return ns


def shown_sources(cells: list[dict]) -> list[tuple[dict, tuple]]:
    """(cell, show_source arguments) for every code cell that is just a `show_source(...)` call."""
    code = [c for c in cells if c["cell_type"] == "code"]
    shown = [c for c in code if SHOW_CALL.fullmatch("".join(c["source"]).strip())]
    ns = utils_namespace(code) if shown else {}
    calls = ["".join(c["source"]).split("#")[0].strip() for c in shown]
    return [(c, eval(call.replace("show_source", "(lambda *a: a)", 1), ns))
            for c, call in zip(shown, calls)]


def refresh(path: Path) -> int:
    """Rewrite the stored outputs of `path`'s show_source cells from the current code; returns
    how many changed. Execution counts and every other cell stay as they are."""
    from IPython.core.formatters import DisplayFormatter

    nb = json.loads(Path(path).read_text())
    changed = 0
    for cell, args in shown_sources(nb["cells"]):
        data, _ = DisplayFormatter().format(show_source(*args))
        data = {k: v.splitlines(keepends=True) for k, v in sorted(data.items())}
        old = cell["outputs"][0] if cell["outputs"] else None
        if old is None or old.get("data") != data:
            count = cell.get("execution_count")
            cell["outputs"] = [{"data": data, "execution_count": count, "metadata": {},
                                "output_type": "execute_result"}]
            changed += 1
    if changed:
        Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {refresh(Path(name))} shown sources re-rendered")


class Table:
    """A results table that displays as a table: HTML in JupyterLab and on the course website,
    where a printed fixed-width table wider than the page scrolls sideways; aligned text in a
    terminal or a plain-text output (`str`). `rows` are lists in the order of `columns`;
    floats (numpy's and 0-d float tensors too) are shown with `digits` decimals, everything
    else as `str` gives it.

        Table(["model", "val ppl"], [["LSTM", 4.92], ["GRU", 4.82]], title="validation")
    """

    def __init__(self, columns: list[str], rows: list[list], title: str | None = None,
                 digits: int = 4):
        if any(len(row) != len(columns) for row in rows):
            widths = sorted({len(row) for row in rows})
            raise ValueError(f"every row needs {len(columns)} entries, one per column {columns}; "
                             f"got rows of {widths}")
        self.columns, self.title, self.digits = list(columns), title, digits
        self.rows = [[self._text(v) for v in row] for row in rows]

    def _text(self, value) -> str:
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy or torch scalar
            value = value.item()  # -> a Python float, int, bool, ...
        return f"{value:.{self.digits}f}" if isinstance(value, float) else str(value)

    def __str__(self) -> str:
        widths = [max([len(c), *(len(r[i]) for r in self.rows)]) for i, c in enumerate(self.columns)]

        def line(cells):
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

        lines = [line(self.columns), line(["-" * w for w in widths]), *map(line, self.rows)]
        return "\n".join(([self.title] if self.title else []) + lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from html import escape

        head = "".join(f"<th>{escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>" for row in self.rows)
        caption = f"<caption>{escape(self.title)}</caption>" if self.title else ""
        return f'<table class="results">{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
