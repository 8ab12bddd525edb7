"""Show the code a notebook teaches: one `utils` definition at a time, syntax-highlighted."""

from __future__ import annotations

import inspect
import textwrap


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
