"""Ints in the narrowest width that holds them, the one home of that choice for stage 05: each byte per row is
10 MB of every table on a 10 M-event trace. numpy only (parse processes import it)."""

from __future__ import annotations

import numpy as np


def int_width(lo: int, hi: int) -> type:
    """The narrowest of int8/16/32/64 that holds lo..hi."""
    return next(t for t in (np.int8, np.int16, np.int32, np.int64) if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)


def narrow_ints(values: np.ndarray) -> np.ndarray:
    """An int column in the narrowest ints that hold its values (the same array when it is
    already); not an int column, or empty: as it is."""
    if values.dtype.kind != "i" or not len(values):
        return values
    width = int_width(int(values.min()), int(values.max()))
    return values if width == values.dtype else values.astype(width)
