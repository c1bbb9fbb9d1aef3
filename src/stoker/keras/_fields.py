"""A batch with fields as Keras inputs: one flat dict of arrays, keyed by field name.

Keras feeds a multi-input model from a dict whose keys are its ``keras.Input`` names, and
every value must be an array with the batch on its first axis. So each field is given in its
padded form: numeric ``(B, *shape)``, mask ``(B, H, W)``, size int32 ``(B, 2)``; a ragged field
``(B, max_len, *shape)`` zero-padded plus ``"<name>_lengths"`` int32 ``(B,)``; text and bytes
as their uint8 ``(B, max_len)`` column (UTF-8 for text) plus ``"<name>_lengths"``. ``max_len``
is the set's, so every batch has the same shapes and the model is built once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LENGTHS_SUFFIX", "field_arrays", "own"]

#: The key of a variable field's lengths beside its padded column.
LENGTHS_SUFFIX = "_lengths"


def field_arrays(batch: Any, names: Sequence[str], image: Any, copy: bool) -> dict[str, Any]:
    """``{name: array}`` for ``names`` of ``batch`` (the image name gives ``image``, already
    converted), variable fields with their lengths beside them; ``copy``: own every array
    (the loader reuses the slot the columns live in)."""
    schema = getattr(batch, "schema", None)
    if schema is None:
        raise ValueError(
            "inputs= names fields, but the loader's batches carry none; load a set with "
            "fields (Loader(..., fields=[...]))"
        )
    out: dict[str, Any] = {}
    for name in names:
        if name == schema.image_name:
            out[name] = image
            continue
        if name == schema.header_name:
            value = batch.labels
        elif name in batch.fields:
            value = batch.fields[name]
        else:
            raise KeyError(f"the batches have no field {name!r}; they have {list(schema)}")
        out[name] = np.array(value) if copy else value
        if name in batch.lengths:
            out[name + LENGTHS_SUFFIX] = np.array(batch.lengths[name])
    return out


def own(x: Any) -> Any:
    """A copy of ``x`` (an array, a dict of arrays, or None) that no loader slot backs."""
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: np.array(v) for k, v in x.items()}
    return np.array(x)
