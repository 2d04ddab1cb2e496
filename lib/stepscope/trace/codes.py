"""Per-event text as codes (pandas Categoricals): the one home of how stage 05 keeps and maps a text column. A
str per row was most of stage 05's peak memory; anything read from a value is judged once per distinct value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd


def map_codes(c: pd.Categorical, value_of: Callable[[Any], Any] | None = None,
              missing: Any = None) -> pd.Categorical:
    """Per row of `c`, `value_of(its value)` (`missing` for a missing one), each used category judged once;
    only used values kept, sorted, through a lookup of the codes."""
    codes = c.codes
    used = np.zeros(len(c.categories) + 1, dtype=bool)  # the last entry: code -1 (missing)
    used[codes] = True
    old = np.flatnonzero(used[:-1])
    values = list(c.categories[old]) if value_of is None else [value_of(x) for x in c.categories[old]]
    if used[-1]:
        values.append(missing)
    dtype = pd.CategoricalDtype(sorted({v for v in values if v is not None}), ordered=c.ordered)
    n = len(dtype.categories)
    width = np.int8 if n < 127 else np.int16 if n < 32_767 else np.int32  # pandas' own code width
    lut = np.full(len(c.categories) + 1, -1, dtype=width)
    if n:
        at = {v: i for i, v in enumerate(dtype.categories)}
        lut[np.append(old, len(c.categories)) if used[-1] else old] = [at.get(v, -1) for v in values]
    return pd.Categorical.from_codes(lookup(lut, codes), dtype=dtype)


def text_codes(values: pd.Series | pd.Categorical | np.ndarray) -> pd.Categorical:
    """A per-event text column as codes into the distinct values it uses, sorted."""
    if isinstance(values, pd.Categorical) or (
            isinstance(values, pd.Series) and isinstance(values.dtype, pd.CategoricalDtype)):
        return map_codes(values if isinstance(values, pd.Categorical) else values.array)
    return pd.Categorical(np.asarray(values, dtype=object))


def text_column_codes(col: pd.Series | None, n: int, blank: str = "") -> tuple[np.ndarray, list]:
    """(codes, values) of a per-event text column: its Categorical codes, else factorized (-1
    for a missing value); no column at all is `blank` throughout."""
    if col is None:
        return np.zeros(n, dtype=np.int64), [blank]
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(), list(col.cat.categories)
    codes, uniq = pd.factorize(col.to_numpy(object))
    return codes, list(uniq)


def lookup(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`table[index]`, a slice of `index` at a time: numpy widens int8/int32 indices to int64
    first, 8 bytes per row for what is often a 1-byte result (issue 26)."""
    out = np.empty(len(index), dtype=table.dtype)
    for lo in range(0, len(index), FACTORIZE_CHUNK_ROWS):
        out[lo:lo + FACTORIZE_CHUNK_ROWS] = table[index[lo:lo + FACTORIZE_CHUNK_ROWS]]
    return out


def take_codes(c: pd.Categorical, positions: np.ndarray) -> pd.Categorical:
    """`c.take(positions)`, through `lookup`."""
    return pd.Categorical.from_codes(lookup(c.codes, positions), dtype=c.dtype)


def used_values(col: pd.Series) -> np.ndarray:
    """The distinct values of a column (no set order), its codes marked a slice at a time."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return np.asarray(col.unique(), dtype=object)
    codes, cats = col.array.codes, col.array.categories
    seen = np.zeros(len(cats) + 1, dtype=bool)  # the last: code -1, a missing value
    for lo in range(0, len(codes), FACTORIZE_CHUNK_ROWS):
        seen[codes[lo:lo + FACTORIZE_CHUNK_ROWS]] = True
    return np.asarray(cats, dtype=object)[seen[:-1]]


def in_values(col: pd.Series, values) -> np.ndarray:
    """`col.isin(values)` as a bool array; on a Categorical, judged once per category. pandas'
    isin on a Categorical made int64 codes first: 9 bytes per event for each mask (issue 26)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.array.codes
        lut = np.append(col.array.categories.isin(list(values)), False)  # the last: code -1
        return lut[codes]
    return col.isin(values).to_numpy()


FACTORIZE_CHUNK_ROWS = 1 << 16
"""Rows `factorize_keys` reads at a time."""


def factorize_keys(n: int, key_of: Callable[[slice], np.ndarray], *, narrow: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """pd.factorize of the int64 keys `key_of(slice)` gives for rows 0..n, a slice at a time: (codes, distinct
    keys in order of first appearance); `narrow` gives the narrowest ints."""
    uniq = first_keys(n, key_of)
    width = (np.int8 if len(uniq) < 2**7 else np.int16 if len(uniq) < 2**15 else np.int32) if narrow else np.int32
    return lookup_keys(n, key_of, uniq, np.arange(len(uniq), dtype=width)), uniq


def count_codes(codes, n: int, mask: np.ndarray | None = None) -> np.ndarray:
    """int64 rows per code 0..n-1 (where `mask` holds), np.bincount a slice at a time."""
    mask = None if mask is None or mask.all() else mask
    out = np.zeros(n, dtype=np.int64)
    for lo in range(0, len(codes), FACTORIZE_CHUNK_ROWS):
        part = codes[lo:lo + FACTORIZE_CHUNK_ROWS]
        out += np.bincount(part if mask is None else part[mask[lo:lo + FACTORIZE_CHUNK_ROWS]], minlength=n)
    return out


def group_medians(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per code 0..n-1 the median of its finite `values` (NaN for none), equal to pandas' groupby median to
    the bit, without its per-row temporaries."""
    out = np.full(n, np.nan)
    if n <= MEDIAN_GROUPS_BY_MASK:  # a few groups: each one's values picked through a mask
        parts = (values[codes == g] for g in range(n))
    else:
        order = np.argsort(codes, kind="stable")
        ordered = values[order]
        del order
        ends = np.cumsum(count_codes(codes, n))
        parts = (ordered[lo:hi] for lo, hi in zip(np.r_[0, ends[:-1]].tolist(), ends.tolist()))
    for g, part in enumerate(parts):
        part = part[np.isfinite(part)] if not np.isfinite(part).all() else part
        if len(part):
            out[g] = np.median(part, overwrite_input=True)
    return out


MEDIAN_GROUPS_BY_MASK = 16
"""Up to this many groups `group_medians` picks each one's values through a mask (a byte a row
and the group's values); beyond, one sort of every row."""


def value_counts(col: pd.Series) -> pd.Series:
    """`col.value_counts()`: on a Categorical its codes counted by `count_codes` and sorted as
    pandas sorts them. pandas' own made int64 codes and a mask per row first (issue 26)."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return col.value_counts()
    counts = count_codes(col.array.codes[col.array.codes >= 0], len(col.array.categories))
    out = pd.Series(counts, index=pd.CategoricalIndex(col.array.categories, dtype=col.dtype), name="count")
    return out.sort_values(ascending=False)


def first_keys(n: int, key_of: Callable[[slice], np.ndarray]) -> np.ndarray:
    """The distinct int64 keys `key_of(slice)` gives for rows 0..n, in order of first
    appearance (`factorize_keys`' uniques), with no code per row: a slice at a time."""
    known = np.empty(0, dtype=np.int64)
    first_at = np.empty(0, dtype=np.int64)
    for lo in range(0, n, FACTORIZE_CHUNK_ROWS):
        u, first = np.unique(key_of(slice(lo, lo + FACTORIZE_CHUNK_ROWS)), return_index=True)
        new = ~np.isin(u, known)
        known = np.concatenate([known, u[new]])
        first_at = np.concatenate([first_at, lo + first[new]])
    return known[np.argsort(first_at, kind="stable")]


def lookup_keys(n: int, key_of: Callable[[slice], np.ndarray], keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row 0..n, the value of its key (`values[i]` belongs to `keys[i]`, which holds every
    key `key_of` gives), in `values`' dtype, a slice at a time."""
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_values = keys[order], values[order]
    out = np.empty(n, dtype=values.dtype)
    for lo in range(0, n, FACTORIZE_CHUNK_ROWS):
        out[lo:lo + FACTORIZE_CHUNK_ROWS] = sorted_values[np.searchsorted(sorted_keys, key_of(slice(lo, lo + FACTORIZE_CHUNK_ROWS)))]
    return out
