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
