import pytest

from utils.show import show_source, source_of
from utils.text import Vocab


def test_source_of_a_method_is_dedented():
    src = source_of(Vocab, "encode")
    assert src.startswith("def encode(")


def test_show_source_renders_code():
    code = show_source(Vocab)
    assert "class Vocab" in code.data and code.language == "python"


def test_builtins_get_a_clear_error():
    with pytest.raises(TypeError, match="cannot show the source"):
        source_of(len)


def test_refresh_rewrites_a_stale_shown_source(tmp_path):
    """`python -m utils.show` re-renders a stale show_source output from the current code."""
    import json

    from utils.show import refresh, source_of

    cell = {"cell_type": "code", "execution_count": 3, "metadata": {}, "outputs": [
        {"data": {"text/plain": ["old"]}, "execution_count": 3, "metadata": {}, "output_type": "execute_result"}],
        "source": ["show_source(seed_everything)"]}
    imports = {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
               "source": ["from utils.settings import seed_everything"]}
    nb = {"cells": [imports, cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert refresh(path) == 1 and refresh(path) == 0
    out = json.loads(path.read_text())["cells"][1]["outputs"][0]
    from utils.settings import seed_everything
    assert "".join(out["data"]["text/plain"]).strip() == source_of(seed_everything).strip()
    assert out["execution_count"] == 3 and "text/html" in out["data"]


def test_a_table_displays_as_html_and_prints_aligned():
    """Headline tables render as HTML tables (the website's column never scrolls sideways for
    them) and stay readable as text."""
    import pytest

    from utils.show import Table

    t = Table(["model", "val ppl", "note"], [["LSTM", 4.9213, "<5"], ["GRU", 4.8, 3]], title="val")
    assert str(t).splitlines() == ["val", "model  val ppl  note", "-----  -------  ----",
                                   "LSTM   4.9213   <5", "GRU    4.8000   3"]
    html = t._repr_html_()
    assert html.count("<tr>") == 3 and "<caption>val</caption>" in html and "&lt;5" in html
    assert str(Table(["a", "b"], [])) == "a  b\n-  -"  # no rows yet: the header alone
    with pytest.raises(ValueError, match="every row needs 3 entries"):
        Table(["a", "b", "c"], [[1, 2]])


def test_a_table_rounds_numpy_and_torch_floats_too():
    """np.float32 is no Python float (np.float64 is): its every digit was printed, and a 0-d
    tensor printed as "tensor(...)". Integers and booleans of any kind stay as they are."""
    import numpy as np
    import torch

    from utils.show import Table

    row = [np.float32(1 / 3), np.float64(2 / 3), torch.tensor(0.25), np.int64(3), np.bool_(True), 7]
    assert Table(list("abcdef"), [row], digits=2).rows == [["0.33", "0.67", "0.25", "3", "True", "7"]]
