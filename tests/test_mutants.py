"""Tests for mutants that the mutation run of scripts/mutation.sh (mutmut) left alive. Each names
the mutation it kills; docs/TESTING.md lists every survivor with its judgement."""

from __future__ import annotations

import pytest

from ftw import spec
from ftw.errors import FtwError
from ftw.layer_ranges import format_layers, parse_layers

# --- ftw/layer_ranges.py ----------------------------------------------------------------------


# kills: `or` -> `and` in the "no selection" test; "" / "all" mutated
@pytest.mark.parametrize("text", [None, "", "  ", "all", " all "])
def test_no_selection_means_every_layer(text):
    assert parse_layers(text) is None
    assert parse_layers(text, limit=4) is None


# kills: the model's layer count ignored (bound always the format's limit), min() arguments lost
def test_a_range_past_the_models_layers_is_refused_naming_them():
    assert parse_layers("0-3", limit=4) == [0, 1, 2, 3]
    with pytest.raises(FtwError) as e:
        parse_layers("2-4", limit=4)
    msg = str(e.value)
    assert "'2-4'" in msg and "the model's 4 layers" in msg and "highest index 3" in msg


# kills: `hi >= bound` -> `hi > bound`; the format-limit message and its highest index
def test_the_format_limit_is_the_bound_without_a_model():
    top = spec.MAX_LAYERS - 1
    assert parse_layers(f"{top}") == [top]
    with pytest.raises(FtwError) as e:
        parse_layers(f"{spec.MAX_LAYERS}")
    msg = str(e.value)
    assert f"the format's limit of {spec.MAX_LAYERS} layers" in msg and f"highest index {top}" in msg
    # a model with more layers than the format allows is still bounded by the format
    with pytest.raises(FtwError, match="the format's limit"):
        parse_layers(f"{spec.MAX_LAYERS}", limit=spec.MAX_LAYERS + 10)


# kills: `lo is None or hi is None or lo > hi` with an `or` turned into `and`; the message lost
@pytest.mark.parametrize("text", ["3-1", "x-3", "3-", "-3", "1-x", "01-3", "1,,2"])
def test_malformed_parts_are_refused_naming_the_part(text):
    with pytest.raises(FtwError) as e:
        parse_layers(text)
    assert "is not a layer index or range like 0-3" in str(e.value)


# kills: format_layers stepping past the layer after a run; the separator mutated
@pytest.mark.parametrize("layers, text", [
    ([0, 2], "0,2"), ([0, 1, 2, 3, 10], "0-3,10"), ([5, 1, 2, 7, 8, 9], "1-2,5,7-9"), ([4], "4"), ([], ""),
])
def test_format_layers_is_the_inverse_of_parse_layers(layers, text):
    assert format_layers(layers) == text
    if layers:
        assert parse_layers(text) == sorted(layers)
