"""Tests of utils.loading: the configuration check every weight loader shares."""

import pytest

from utils.loading import check_same


def test_equal_configurations_pass():
    check_same("ref", {"n_heads": 2, "eps": 1e-5}, {"n_heads": 2, "eps": 1e-5})


def test_a_difference_names_the_field_and_both_values():
    with pytest.raises(ValueError) as err:
        check_same("GPT2LMHeadModel", {"n_heads": 2, "activation": "gelu_tanh", "eps": 1e-5},
                   {"n_heads": 4, "activation": "relu", "eps": 1e-5})
    message = str(err.value)
    print(message)
    assert "n_heads: GPT2LMHeadModel has 4, ours has 2" in message
    assert "activation: GPT2LMHeadModel has 'relu', ours has 'gelu_tanh'" in message
    assert "eps" not in message  # only the fields that differ


def test_ignore_skips_named_fields_and_only_those():
    check_same("ref", {"activation": "gelu"}, {"activation": "gelu_tanh"}, ignore=("activation",))
    with pytest.raises(ValueError, match="only compared fields"):
        check_same("ref", {"activation": "gelu"}, {"activation": "gelu"}, ignore=("activaton",))
    with pytest.raises(ValueError, match="cannot compare"):
        check_same("ref", {"n_heads": 2}, {"heads": 2})
