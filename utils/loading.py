"""Copying weights from a reference model: the configuration check every loader shares.

A loader (`MultiHeadAttention.load_from_torch`, `EncoderBlock.load_from_torch`,
`gpt.load_from_hf`, `vit.load_from_hf`, ...) copies tensors, and a tensor copy checks shapes
only. A field that changes the function without changing a shape (the number of heads, the
activation, biases, where the layer norms sit, their epsilon, weight tying) would slip
through, and the copy would compute another function without a word. So each loader first
lists those fields for both sides, in our names and conventions, and calls `check_same`.
"""

from __future__ import annotations

from collections.abc import Iterable


def check_same(source: str, ours: dict, theirs: dict, ignore: Iterable[str] = ()) -> None:
    """Refuse to copy `source` when a configuration field differs: a ValueError names every
    differing field with both values.

    ours, theirs: field -> value, the same fields on both sides. `ignore` names fields to leave
    unchecked on purpose, e.g. for a near miss that copies GPT-2 into a model with another
    activation to show how much that changes.
    """
    ignore = set(ignore)
    if set(ours) != set(theirs) or not ignore <= set(ours):
        raise ValueError(f"cannot compare {source}: fields {sorted(ours)} vs {sorted(theirs)}, "
                         f"ignore {sorted(ignore)} (only compared fields can be ignored)")
    diffs = [f"{field}: {source} has {theirs[field]!r}, ours has {ours[field]!r}"
             for field in ours if field not in ignore and ours[field] != theirs[field]]
    if diffs:
        raise ValueError(f"cannot copy {source}, its configuration differs: " + "; ".join(diffs)
                         + ". Build our model with the reference's values.")
