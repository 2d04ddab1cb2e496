"""Overlap-aware accounting: count, sum, union and exposed time per rank, step and category.

Kernels overlap, even on one stream, so a category's time is the union of its intervals, and exposed time
follows the class priority compute > communication > memory (docs/methods.md#accounting-identities). Overlap
within a class is split in proportion to each category's own exposed time, so the categories' exposed times
add up to busy exactly.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from stepscope.palette import GEMM_CATEGORIES
from stepscope.trace.categorize import CATEGORY_CLASS, COLLECTIVE_CATEGORIES
from stepscope.trace.codes import count_codes, factorize_keys, lookup, text_column_codes
from stepscope.trace.step_sources import EXCLUDED_KINDS


def merged_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint, sorted [start, end) intervals covering the given ones."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    o = np.argsort(starts, kind="stable")
    s = np.asarray(starts, float)[o]
    e = np.maximum.accumulate(np.asarray(ends, float)[o])
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    last = np.r_[idx[1:] - 1, len(s) - 1]
    return s[idx], e[last]


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of [start, end) intervals."""
    s, e = merged_intervals(starts, ends)
    return float((e - s).sum())


def covered_length(starts: np.ndarray, ends: np.ndarray, win_a: np.ndarray, win_b: np.ndarray) -> float:
    """Total length of the union of [start, end) intervals that lies inside the windows
    [win_a, win_b) (disjoint windows; each counted once)."""
    ms, me = merged_intervals(starts, ends)
    return float(covered_per_window(ms, me, np.asarray(win_a, float), np.asarray(win_b, float)).sum())


def covered_per_window(ms: np.ndarray, me: np.ndarray, win_a: np.ndarray, win_b: np.ndarray) -> np.ndarray:
    """Per window [win_a, win_b), the length of the disjoint sorted intervals [ms, me)
    (`merged_intervals`) inside it; windows may overlap."""
    if not len(ms) or not len(win_a):
        return np.zeros(len(win_a))
    cum = np.r_[0.0, np.cumsum(me - ms)]

    def upto(t: np.ndarray) -> np.ndarray:  # covered length before t (0 before the first interval)
        k = np.maximum(np.searchsorted(ms, t, side="right") - 1, 0)
        return cum[k] + np.clip(t - ms[k], 0.0, me[k] - ms[k])

    return upto(win_b) - upto(win_a)


def grouped_union(keys, starts: np.ndarray, ends: np.ndarray) -> pd.Series:
    """Union length of the intervals in each group, indexed by group key."""
    keys = np.asarray(keys)
    if len(keys) == 0:
        return pd.Series(dtype=float)
    codes, uniq = pd.factorize(keys)
    s0 = np.asarray(starts, float)
    o = np.argsort(s0, kind="stable")
    out = _union_by_code(codes[o], s0[o], np.asarray(ends, float)[o], len(uniq))
    return pd.Series(out, index=uniq)


class Ends:
    """Each work row's end, `start_us + dur_us`, made where it is read (`ends[rows]`) rather than stored: the
    same float the build made, 8 bytes a row saved."""

    def __init__(self, start: np.ndarray, dur: np.ndarray) -> None:
        self.start, self.dur = start, dur

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, rows) -> np.ndarray:
        return self.start[rows] + self.dur[rows]


def end_us(work: pd.DataFrame) -> np.ndarray:
    """Each work row's end (µs): its start plus its duration (`Ends`, every row)."""
    return Ends(work["start_us"].to_numpy(float), work["dur_us"].to_numpy(float))[:]


UNION_CHUNK_ROWS = 1 << 16
"""Rows `_union_by_code`, `_weighted_sum` and `_first_start_last_end` read at a time: their temporaries (up to ~60 bytes a row where every
row starts a segment, as tiny kernels do) stay this size on a trace of any length (issue 26)."""


class _InCategories:
    """Per row, whether its category code (`cc`) is one of `cats` (a bool per category), made
    a slice at a time where read (`mask[lo:hi]`), like `_PairCodes`."""

    def __init__(self, cc: np.ndarray, cats: np.ndarray) -> None:
        self.cc, self.cats = cc, cats

    def __len__(self) -> int:
        return len(self.cc)

    def __getitem__(self, rows: slice) -> np.ndarray:
        return self.cats[self.cc[rows]]


def _union_by_code(codes: np.ndarray, s: np.ndarray, e: np.ndarray | Ends, n: int,
                   mask: np.ndarray | _InCategories | None = None) -> np.ndarray:
    """Union length per integer code 0..n-1 of intervals sorted by start (rows where `mask` holds).

    Exact: only max and subtraction of the trace's own values, one running max per group; read a chunk at a
    time, an open segment carrying into the next chunk.
    """
    out = np.zeros(n)
    if not (codes[1:] >= codes[:-1]).all():  # not grouped (steps in time order are): sort a copy
        if mask is not None:
            mask = mask if isinstance(mask, np.ndarray) else mask[:]
            codes, s, e = codes[mask], s[mask], e[mask]
        o = np.argsort(codes, kind="stable")  # keeps start order within each code
        codes, s, e, mask = codes[o], s[o], e[o], None
        del o
    carried = None
    for lo in range(0, len(codes), UNION_CHUNK_ROWS):
        part = slice(lo, lo + UNION_CHUNK_ROWS)
        c, ps, pe = codes[part], s[part], e[part]
        if mask is not None:
            m = mask[part]
            c, ps, pe = c[m], ps[m], pe[m]
        if len(c):
            carried = _union_chunk(c, ps, pe, carried, out)
    if carried is not None:
        np.add.at(out, [carried[0]], [carried[2] - carried[1]])
    return out


def _union_chunk(c: np.ndarray, s: np.ndarray, e: np.ndarray, carried: tuple | None,
                 out: np.ndarray) -> tuple:
    """Add to `out` the segments of one chunk that end inside it; return the last segment,
    still open, as (code, start, running max of its group). `carried`: the previous chunk's."""
    bounds = np.flatnonzero(np.diff(c)) + 1
    run = np.empty(len(e))
    for lo, hi in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(c)].tolist()):
        np.maximum.accumulate(e[lo:hi], out=run[lo:hi])
    goes_on = False
    if carried is not None and carried[0] == c[0]:  # the group goes on: so does its running max
        head = run[:bounds[0] if len(bounds) else len(run)]
        np.maximum(head, carried[2], out=head)
        goes_on = bool(s[0] <= carried[2])
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    new[bounds] = True
    seg = np.flatnonzero(new)
    del new
    last = np.empty_like(seg)
    last[:-1] = seg[1:] - 1
    last[-1] = len(s) - 1
    code, start, end = c[seg], s[seg], run[last]
    del run, seg, last
    if goes_on:
        start[0] = carried[1]
    elif carried is not None:
        np.add.at(out, [carried[0]], [carried[2] - carried[1]])
    np.add.at(out, code[:-1], end[:-1] - start[:-1])
    return code[-1], start[-1], end[-1]


def _partition(exposed: np.ndarray, klass: np.ndarray, class_len: dict[str, np.ndarray]) -> np.ndarray:
    """Exposed time per (key, category) scaled so each class's categories sum to the class's exposed length:
    overlapping categories of one class would otherwise count the shared stretch once each."""
    out = exposed.copy()
    for name, length in class_len.items():
        cols = klass == name
        if not cols.any():
            continue
        own = out[:, cols].sum(axis=1)
        scale = np.divide(np.asarray(length, float), own, out=np.ones_like(own), where=own > length)
        out[:, cols] *= scale[:, None]
    return out


def _category_codes(category: pd.Series, order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, in `order`; the distinct categories, object): a Categorical's own codes
    (its used categories), else factorized. Never a str per row."""
    if isinstance(category.dtype, pd.CategoricalDtype) and not category.isna().any():
        codes = category.cat.codes.to_numpy()
        codes = codes if order is None else codes[order]
        used = np.flatnonzero(count_codes(codes, len(category.cat.categories)))
        # numbered by first appearance in start order, as factorizing the text would
        used = used[np.argsort([int(np.argmax(codes == k)) for k in used], kind="stable")]
        remap = np.full(len(category.cat.categories), -1, dtype=np.int8 if len(used) < 127 else np.int32)
        remap[used] = np.arange(len(used))
        return lookup(remap, codes), np.asarray(category.cat.categories, dtype=object)[used]
    cc, uniq = pd.factorize(np.asarray(category.to_numpy() if order is None else category.to_numpy()[order],
                                       dtype=object))
    return cc, np.asarray(uniq, dtype=object)


def _unions(kc: np.ndarray, cc: np.ndarray, s: np.ndarray, e: np.ndarray | Ends, nk: int, klass: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per key (codes `kc`, rows in start order): compute, compute+communication and busy union
    lengths; per (key, category `cc`): union and exposed time, flat as key * ncat + category."""
    ncat = len(klass)
    # each set of rows as the set of categories it takes, judged a slice at a time
    comp, comm = klass == "compute", klass == "communication"

    def gu(cats: np.ndarray) -> np.ndarray:
        return _union_by_code(kc, s, e, nk, _InCategories(cc, cats))

    c_len = gu(comp)
    cm_len = gu(comp | comm)
    busy = _union_by_code(kc, s, e, nk)  # every row: read in place
    # one category at a time: its rows keep the key order, so no sort and no copy of every row
    union = np.zeros(nk * ncat)
    for ci in range(ncat):
        union[np.arange(nk) * ncat + ci] = gu(np.arange(ncat) == ci)
    exposed = union.copy()  # a compute category's exposed time is its union
    for ci in range(ncat):
        if klass[ci] == "compute":
            continue
        this = np.arange(ncat) == ci
        over = gu(comp | this) - c_len if klass[ci] == "communication" else \
            gu(comp | comm | this) - cm_len
        exposed[np.arange(nk) * ncat + ci] = np.maximum(0.0, over)
    exposed = _partition(exposed.reshape(nk, ncat), klass,
                         {"compute": c_len, "communication": cm_len - c_len, "memory": busy - cm_len}).ravel()
    return c_len, cm_len, busy, union, exposed


def _account(work: pd.DataFrame, key: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (key, category) metrics and per key totals for one rank's work, on integer codes over rows sorted
    once by start."""
    start = work["start_us"].to_numpy()
    # The work table comes sorted (build_work): every column is read in place.
    o = None if (start[1:] >= start[:-1]).all() else np.argsort(start, kind="stable")

    def col(name: str) -> np.ndarray:
        v = work[name].to_numpy()
        return v if o is None else v[o]

    keys = col(key)
    if len(keys) and keys.min() == keys.max():  # one key (the whole rank): no code per row to make
        kc, keys_u = np.zeros(len(keys), dtype=np.int8), keys[:1].copy()
    else:
        # in order of first appearance, as pd.factorize; narrow codes
        kc, keys_u = factorize_keys(len(keys), lambda sl: keys[sl].astype(np.int64), narrow=True)
    keys_u = keys_u.astype(keys.dtype, copy=False)
    cc, cats_u = _category_codes(work["category"], o)
    nk, ncat = len(keys_u), len(cats_u)
    s, dur = col("start_us"), col("dur_us")
    e = Ends(s, dur)
    calls = col("is_call").astype(bool, copy=False)
    coll = col("collective_call")
    klass = np.array([CATEGORY_CLASS.get(c, "compute") for c in cats_u], dtype=object)
    npair = nk * ncat
    pair = cc if nk == 1 else _PairCodes(kc, cc, nk, ncat)  # one key: the key adds nothing
    rows = count_codes(pair, npair)
    present = np.flatnonzero(rows)
    c_len, cm_len, busy, union, exposed = _unions(kc, cc, s, e, nk, klass)
    cat_tab = pd.DataFrame({
        key: keys_u[present // ncat],
        "category": cats_u[present % ncat],
        "class": klass[present % ncat],
        "count": count_codes(pair, npair, calls)[present],
        "sum_us": _weighted_sum(pair, dur, npair)[present],
        "union_us": union[present],
        "exposed_us": exposed[present],
    })

    starts, ends = _first_start_last_end(kc, s, e, nk)

    def calls_of(name: str) -> np.ndarray:
        """Per key, the collective calls of one category (its rows' mask made only then)."""
        return count_codes(kc, nk, coll & lookup(cats_u == name, cc)) if name in set(cats_u) else np.zeros(nk, np.int64)

    tot = pd.DataFrame({
        key: keys_u,
        "n_events": count_codes(kc, nk, calls),
        "kernel_sum_us": _weighted_sum(kc, dur, nk),
        "busy_us": busy,
        "span_us": ends - starts,
        "compute_us": c_len,
        "comm_exposed_us": cm_len - c_len,
        "memory_exposed_us": busy - cm_len,
        "all_reduce_calls": calls_of("all_reduce"),
        "all_gather_calls": calls_of("all_gather"),
        # every call neither an all-reduce nor an all-gather, all-to-alls too (no column of their own)
        "other_collective_calls": calls_of("other_collective") + calls_of("all_to_all"),
        "first_start_us": starts,
    })
    tot["idle_us"] = tot["span_us"] - tot["busy_us"]
    return cat_tab, tot


class _PairCodes:
    """Each row's (key, category) code, `key * ncat + category`, made a slice at a time where
    read (`codes[lo:hi]`): a code per row was 4 bytes an event of the accounting's peak."""

    def __init__(self, kc: np.ndarray, cc: np.ndarray, nk: int, ncat: int) -> None:
        self.kc, self.cc, self.ncat = kc, cc, ncat
        self.dtype = np.int32 if nk * ncat < 2**31 else np.int64

    def __len__(self) -> int:
        return len(self.kc)

    def __getitem__(self, rows: slice) -> np.ndarray:
        out = self.kc[rows].astype(self.dtype)
        out *= self.ncat
        out += self.cc[rows]
        return out


def _weighted_sum(codes: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """`np.bincount(codes, weights)`, a slice at a time: the same additions in the same row
    order (so the same bits), without widening every code to int64 first."""
    out = np.zeros(n)
    for lo in range(0, len(codes), UNION_CHUNK_ROWS):
        np.add.at(out, codes[lo:lo + UNION_CHUNK_ROWS], weights[lo:lo + UNION_CHUNK_ROWS])
    return out


def _first_start_last_end(kc: np.ndarray, s: np.ndarray, e: np.ndarray | Ends, nk: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Per key code (rows in start order): its first row's start and its largest end (NaN ends skipped), a
    slice at a time."""
    first = np.full(nk, -1, dtype=np.int64)
    ends = np.full(nk, -np.inf)
    for lo in range(0, len(kc), UNION_CHUNK_ROWS):
        k = kc[lo:lo + UNION_CHUNK_ROWS]
        u, at = np.unique(k, return_index=True)
        new = first[u] < 0
        first[u[new]] = lo + at[new]
        np.fmax.at(ends, k, e[lo:lo + UNION_CHUNK_ROWS])
    ends[np.isneginf(ends)] = np.nan  # every end NaN: pandas' max is NaN
    return s[first], ends


_ACCOUNT_COLUMNS = ["step_id", "category", "start_us", "dur_us", "is_call", "collective_call"]
"""The work columns `_account` reads."""


def account_steps(work: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(step_categories, step_totals) for one rank; steps with no work get zero rows."""
    rank = int(steps["rank"].iloc[0]) if len(steps) else -1
    att = rows_of(work, work["step_id"].to_numpy() >= 0, _ACCOUNT_COLUMNS)
    cat_tab, tot = _account(att, "step_id") if len(att) else (
        pd.DataFrame(columns=["step_id", "category", "class", "count", "sum_us", "union_us",
                              "exposed_us"]), pd.DataFrame(columns=["step_id", "first_start_us"]))
    cat_tab.insert(0, "rank", rank)
    meta = steps[["step_id", "name", "source", "label", "kind", "n_requests", "n_tokens",
                  "prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens",
                  "ts", "dur"]].rename(columns={"ts": "annotation_ts_us", "dur": "annotation_dur_us"})
    tot = meta.merge(tot, on="step_id", how="left")
    zero_cols = ["n_events", "kernel_sum_us", "busy_us", "span_us", "compute_us", "comm_exposed_us",
                 "memory_exposed_us", "idle_us", "all_reduce_calls", "all_gather_calls",
                 "other_collective_calls"]
    for c in zero_cols:
        # no work tied to any step: every step has zero work rather than the step columns missing
        tot[c] = tot[c].fillna(0) if c in tot else 0.0
    for c in ("n_events", "all_reduce_calls", "all_gather_calls", "other_collective_calls"):
        if c in tot:
            tot[c] = tot[c].astype(np.int64)
    tot.insert(0, "rank", rank)
    return cat_tab, tot


def account_rank(work: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Whole-rank categories (all work, attributed or not) and totals."""
    w = work[[c for c in _ACCOUNT_COLUMNS if c in work and c != "step_id"]].assign(_all=np.zeros(len(work), np.int8))
    cat_tab, tot = _account(w, "_all")
    cat_tab = cat_tab.drop(columns=["_all"])
    t = tot.iloc[0].to_dict()
    t.pop("_all", None)
    return cat_tab, t


# --------------------------------------------------------------------------- decode summary


def select_decode_steps(step_totals: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Decode steps with work; without decode labels, every step with work but a warm-up (and say so)."""
    has_work = (step_totals["n_events"] > 0) & ~step_totals["kind"].isin(EXCLUDED_KINDS)
    dec = step_totals[(step_totals["label"] == "decode") & has_work]
    if len(dec):
        return dec, "decode"
    return step_totals[has_work], "all steps (no decode labels in this trace)"


def decode_categories(step_cats: pd.DataFrame, step_totals: pd.DataFrame,
                      step_times: dict | None = None) -> pd.DataFrame:
    """Per category over one rank's decode steps: ms per step (mean/median/p90 of the union), shares of span
    and period, calls per step and µs per call."""
    dec, _ = select_decode_steps(step_totals)
    ids = dec["step_id"].to_numpy()
    n = len(ids)
    sc = step_cats[step_cats["step_id"].isin(ids)]
    if n == 0 or sc.empty:
        return pd.DataFrame(columns=DECODE_COLUMNS)
    rank = int(step_totals["rank"].iloc[0])
    span_mean = float(dec["span_us"].mean())
    period_ms = ((step_times or {}).get("period_ms") or {}).get("mean")
    busy_mean = float(dec["busy_us"].mean())
    rows = []
    for cat, g in sc.groupby("category", sort=False):
        u = g.set_index("step_id")["union_us"].reindex(ids, fill_value=0.0).to_numpy() / 1e3
        x = g.set_index("step_id")["exposed_us"].reindex(ids, fill_value=0.0).to_numpy() / 1e3
        cnt = g["count"].sum()
        rows.append({
            "rank": rank, "category": cat, "class": CATEGORY_CLASS.get(cat, "compute"),
            "n_steps": n,
            "union_ms_mean": u.mean(), "union_ms_median": float(np.median(u)),
            "union_ms_p90": float(np.percentile(u, 90)),
            "sum_ms_mean": g["sum_us"].sum() / 1e3 / n,
            "exposed_ms_mean": x.mean(),
            "share_of_span": (u.mean() * 1e3 / span_mean) if span_mean else np.nan,
            "share_of_period": (u.mean() / period_ms) if period_ms else np.nan,
            "exposed_share_of_busy": (x.mean() * 1e3 / busy_mean) if busy_mean else np.nan,
            "calls_per_step": cnt / n,
            "us_per_call": (g["sum_us"].sum() / cnt) if cnt else np.nan,
        })
    out = pd.DataFrame(rows).sort_values("union_ms_mean", ascending=False, kind="stable")
    return out[DECODE_COLUMNS].reset_index(drop=True)


def step_groups(step_totals: pd.DataFrame) -> np.ndarray:
    """Each step's group for the per-kind table: its kind, or `verify` for a decode step that scores drafts.
    Kinds are never pooled: a prefill's all-reduce is not a decode step's."""
    kinds = step_totals["kind"].fillna("unknown").astype(str).to_numpy(object)
    if {"decode_tokens", "decode_requests"} <= set(step_totals):
        req, tok = step_totals["decode_requests"].to_numpy(float), step_totals["decode_tokens"].to_numpy(float)
        kinds = np.where((kinds == "decode") & (req > 0) & (tok > req), "verify", kinds)
    return kinds


def kind_categories(step_cats: pd.DataFrame, step_totals: pd.DataFrame) -> pd.DataFrame:
    """Per step kind (`step_groups`) and category on one rank: ms per step (union, exposed, summed) and calls
    per step, beside the kind's busy time and span; the decode figures elsewhere hold decode steps only."""
    groups = step_groups(step_totals)
    has_work = step_totals["n_events"].to_numpy() > 0
    rows = []
    for kind in pd.unique(groups[has_work]):
        st = step_totals[has_work & (groups == kind)]
        ids, n = st["step_id"].to_numpy(), len(st)
        sc = step_cats[step_cats["step_id"].isin(ids)]
        for cat, g in sc.groupby("category", sort=False):
            cnt = g["count"].sum()
            rows.append({"rank": int(step_totals["rank"].iloc[0]), "kind": str(kind), "n_steps": n,
                         "category": cat, "class": CATEGORY_CLASS.get(cat, "compute"),
                         "union_ms_mean": g["union_us"].sum() / 1e3 / n, "exposed_ms_mean": g["exposed_us"].sum() / 1e3 / n,
                         "sum_ms_mean": g["sum_us"].sum() / 1e3 / n, "calls_per_step": cnt / n,
                         "busy_ms_mean": float(st["busy_us"].mean()) / 1e3, "span_ms_mean": float(st["span_us"].mean()) / 1e3})
    out = pd.DataFrame(rows, columns=KIND_COLUMNS)
    return out.sort_values(["kind", "union_ms_mean"], ascending=[True, False], kind="stable").reset_index(drop=True)


KIND_COLUMNS = ["rank", "kind", "n_steps", "category", "class", "union_ms_mean", "exposed_ms_mean", "sum_ms_mean",
                "calls_per_step", "busy_ms_mean", "span_ms_mean"]


DECODE_COLUMNS = ["rank", "category", "class", "n_steps", "union_ms_mean", "union_ms_median",
                  "union_ms_p90", "sum_ms_mean", "exposed_ms_mean", "share_of_span",
                  "share_of_period", "exposed_share_of_busy", "calls_per_step", "us_per_call"]


KERNELS_PER_CATEGORY = 10
"""Names kept per category in category_kernels.csv (the rest are counted in `n_names`)."""

KERNEL_COLUMNS = ["rank", "category", "class", "name", "n_steps", "count", "calls_per_step", "sum_ms_per_step",
                  "us_per_call", "share_of_category", "n_names", "decided_by", "module", "module_share"]


def category_kernels(work: pd.DataFrame, step_totals: pd.DataFrame,
                     top: int = KERNELS_PER_CATEGORY) -> pd.DataFrame:
    """Per category over one rank's decode steps: its `top` kernels by summed time. Summed, not union: a
    kernel's own share is what a fix to it can reach."""
    dec, _ = select_decode_steps(step_totals)
    ids = dec["step_id"].to_numpy()
    w = _decode_rows(work, ids, ["category", "name", "dur_us", "is_call", "category_source", "op_context",
                                 "module_path"])
    if not len(ids) or w.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    n = len(ids)
    key, g = _name_groups(w)
    g["decided_by"] = _most_calls_decided_by(key, _decided_by(w), len(g))
    g = g.merge(_main_module(w, ["category", "name"]), on=["category", "name"], how="left")
    by_cat = g.groupby("category", sort=False, observed=True)
    g["cat_sum"] = by_cat["sum"].transform("sum")
    g["share_of_category"] = g["sum"] / g["cat_sum"]
    g["n_names"] = by_cat["name"].transform("size")
    g = g.sort_values(["cat_sum", "category", "sum", "name"], ascending=[False, True, False, True], kind="stable")
    g = g.groupby("category", sort=False, observed=True).head(top)
    out = pd.DataFrame({
        "rank": int(step_totals["rank"].iloc[0]), "category": g["category"].astype(str),
        "class": g["category"].map(lambda c: CATEGORY_CLASS.get(c, "compute")), "name": g["name"].astype(str),
        "n_steps": n, "count": g["calls"].astype(int), "calls_per_step": g["calls"] / n,
        "sum_ms_per_step": g["sum"] / 1e3 / n, "us_per_call": g["sum"] / g["calls"],
        "share_of_category": g["share_of_category"], "n_names": g["n_names"].astype(int),
        "decided_by": g["decided_by"].astype(object), "module": g["module"], "module_share": g["module_share"]})
    return out[KERNEL_COLUMNS].reset_index(drop=True)


def _name_groups(w: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Per row the code of its (category, name) group, numbered by first appearance; per group its category,
    name, summed `dur_us` (in row order), rows and `calls`. One dense key keeps memory low."""
    cat, name = _as_categorical(w["category"]), _as_categorical(w["name"])
    cc, nc = cat.codes, name.codes
    nn = max(len(name.categories), 1)
    key, uniq = factorize_keys(len(w), lambda sl: cc[sl].astype(np.int64) * nn + nc[sl], narrow=True)
    return key, pd.DataFrame({"category": pd.Categorical.from_codes(uniq // nn, dtype=cat.dtype),
                              "name": pd.Categorical.from_codes(uniq % nn, dtype=name.dtype),
                              "sum": _weighted_sum(key, w["dur_us"].to_numpy(float), len(uniq)),
                              "count": count_codes(key, len(uniq)), "calls": _calls(key, w, len(uniq))})


def _calls(key: np.ndarray, w: pd.DataFrame, n_groups: int) -> np.ndarray:
    """Calls per group of `key`: rows that start a call (`is_call`), since a CPU op's self time is cut into
    pieces; a group with none (a collective's wrapper or wait) counts its rows."""
    rows = count_codes(key, n_groups)
    if "is_call" not in w:
        return rows
    calls = count_codes(key, n_groups, w["is_call"].to_numpy(bool))
    return np.where(calls > 0, calls, rows)


def _as_categorical(col: pd.Series) -> pd.Categorical:
    """A text column as a Categorical with no missing value (a missing one becomes "")."""
    c = col.array if isinstance(col.dtype, pd.CategoricalDtype) else pd.Categorical(col.to_numpy(object))
    if len(c) and c.codes.min() < 0:
        c = pd.Categorical(np.asarray(c.astype(object).fillna(""), dtype=object))
    return c


def _most_calls_decided_by(key: np.ndarray, decided: pd.Series, n_groups: int) -> np.ndarray:
    """Per group of `key`: what placed most of its rows (the first to appear among equals), as
    a groupby of (group, decided_by) sorted by size and deduplicated would say."""
    d = _as_categorical(decided)
    nd = max(len(d.categories), 1)
    dc = d.codes
    pair, uniq = factorize_keys(len(key), lambda sl: key[sl].astype(np.int64) * nd + dc[sl], narrow=True)
    calls = pd.DataFrame({"group": uniq // nd, "decided": uniq % nd, "calls": count_codes(pair, len(uniq))})
    top = calls.sort_values("calls", ascending=False, kind="stable").drop_duplicates("group")
    out = np.empty(n_groups, dtype=object)
    out[top["group"].to_numpy()] = np.asarray(d.categories, dtype=object)[top["decided"].to_numpy()]
    return out


def _decode_rows(work: pd.DataFrame, step_ids: np.ndarray, columns: list[str]) -> pd.DataFrame:
    """The rows of `step_ids`, only the `columns` read (those present): a copy of every column
    of the work table was a large part of stage 05's peak on a kernel-dense trace (issue 26)."""
    return rows_of(work, in_steps(work["step_id"].to_numpy(), step_ids), columns)


def in_steps(step_id: np.ndarray, step_ids: np.ndarray) -> np.ndarray:
    """Per work row, whether its `step_id` is one of `step_ids` (a lookup by id, not isin's hash table): the
    one way stage 05 picks the judged steps' work."""
    ids = np.asarray(step_ids, dtype=np.int64)
    if not len(ids) or ids.min() < 0 or not len(step_id):
        return np.isin(step_id, ids)
    known = np.zeros(int(max(ids.max(), step_id.max())) + 2, dtype=bool)  # the last entry: -1
    known[ids] = True
    return lookup(known, step_id)


def rows_of(work: pd.DataFrame, rows: np.ndarray, columns: list[str]) -> pd.DataFrame:
    """The work rows where mask `rows` holds, only `columns` read, on a fresh RangeIndex; with every row
    picked, the columns themselves, not a copy."""
    keep = [c for c in columns if c in work]
    if rows.all():
        return work[keep]
    # column by column through the mask: `.loc` made int64 positions and labels per row
    return pd.DataFrame({c: picked(work[c], rows) for c in keep}, copy=False)


def picked(col: pd.Series, rows: np.ndarray) -> Any:
    """The values of `col` where the mask `rows` holds (a Categorical stays codes)."""
    a = col.array
    if isinstance(a, pd.Categorical):
        return pd.Categorical.from_codes(a.codes[rows], dtype=a.dtype)
    return col.to_numpy()[rows] if isinstance(col.dtype, np.dtype) else a[rows]


def _main_module(w: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per `keys` group: the module path (`module_path`, from `modules.module_paths`) that
    holds most of its summed time, and that share; None where the trace has no module frames."""
    if "module_path" not in w or not w["module_path"].notna().any():
        return pd.DataFrame(columns=keys + ["module", "module_share"])
    # One dense code per group and per (group, module), numbered by first appearance, sums in row order
    # (`_weighted_sum`).
    cats = [_as_categorical(w[k]) for k in keys]
    mod = w["module_path"].array
    mod = mod if isinstance(mod, pd.Categorical) else pd.Categorical(w["module_path"].to_numpy(object))

    def key_of(sl: slice) -> np.ndarray:
        out = np.zeros(len(cats[0].codes[sl]), dtype=np.int64)
        for c in cats:
            out = out * max(len(c.categories), 1) + c.codes[sl]
        return out

    kc, k_u = factorize_keys(len(w), key_of, narrow=True)
    nm, mc = len(mod.categories) + 1, mod.codes  # module code + 1: 0 for none
    pc, p_u = factorize_keys(len(w), lambda sl: kc[sl].astype(np.int64) * nm + (mc[sl] + 1), narrow=True)
    dur = w["dur_us"].to_numpy(float)
    sums, tot = _weighted_sum(pc, dur, len(p_u)), _weighted_sum(kc, dur, len(k_u))
    has = p_u % nm > 0  # a group's rows inside no module are in its total only
    by = pd.DataFrame({"group": p_u[has] // nm, "module": pd.Categorical.from_codes(p_u[has] % nm - 1, dtype=mod.dtype),
                       "dur_us": sums[has]})
    by = by.sort_values("dur_us", ascending=False, kind="stable").drop_duplicates("group")
    group = by["group"].to_numpy()
    out, rest = {}, k_u[group]
    for k, c in reversed(list(zip(keys, cats))):
        n = max(len(c.categories), 1)
        out[k] = pd.Categorical.from_codes(rest % n, dtype=c.dtype)
        rest = rest // n
    return pd.DataFrame({**{k: out[k] for k in keys}, "module": by["module"].array,
                         "module_share": by["dur_us"].to_numpy() / tot[group]})


LEVER_COLUMNS = ["rank", "category", "class", "n_steps", "sum_ms_per_step", "recompute_ms_per_step", "n_names",
                 "top_kernels", "top_share", "top_kernel", "top_kernel_share", "module", "module_share", "coherent",
                 "why"]


ONE_OPERATION_CATEGORIES = frozenset(GEMM_CATEGORIES) | {"attention", "conv"}
"""Categories that are one operation however many kernel names run it: one fix reaches them all, so their name
count says nothing about coherence."""


def lever_coherent(category: str, n_names: int, top_share: float, module_share: float | None = None) -> bool:
    """Whether a category is one lever: not a grab-bag of LEVER_GRAB_BAG_MIN_NAMES+ kernels whose top
    LEVER_TOP_KERNELS (and top module) hold under LEVER_DOMINANT_SHARE of its time. ONE_OPERATION_CATEGORIES
    always are. The report's guard reads its `coherent` column."""
    from stepscope.thresholds import LEVER_DOMINANT_SHARE, LEVER_GRAB_BAG_MIN_NAMES

    if category in ONE_OPERATION_CATEGORIES or (module_share is not None and module_share >= LEVER_DOMINANT_SHARE):
        return True
    return not (n_names >= LEVER_GRAB_BAG_MIN_NAMES and top_share < LEVER_DOMINANT_SHARE)


def category_levers(work: pd.DataFrame, step_totals: pd.DataFrame) -> pd.DataFrame:
    """Per category over `category_kernels`'s steps: its top kernels with shares (`name (share)` joined by ` |
    `), its main module, and whether it is one lever (`coherent`, `why`)."""
    from stepscope.thresholds import LEVER_TOP_KERNELS

    dec, _ = select_decode_steps(step_totals)
    w = _decode_rows(work, dec["step_id"].to_numpy(), ["category", "name", "dur_us", "recompute", "module_path"])
    if w.empty:
        return pd.DataFrame(columns=LEVER_COLUMNS)
    n = len(dec)
    mod = _main_module(w, ["category"]).set_index("category")
    groups = _name_groups(w)[1]
    recompute = w.loc[w["recompute"].to_numpy(bool), ["category", "dur_us"]] if "recompute" in w else None
    rows = []
    for cat in pd.unique(groups["category"]):  # in order of first appearance, as groupby(sort=False)
        g = groups[(groups["category"] == cat).to_numpy()].sort_values("name", kind="stable")
        per = pd.Series(g["sum"].to_numpy(), index=g["name"].astype(str).to_numpy()).sort_values(
            ascending=False, kind="stable")
        tot = float(per.sum())
        share = per / tot if tot else per * 0.0
        top = share.head(LEVER_TOP_KERNELS)
        module_share = float(mod["module_share"][cat]) if cat in mod.index else None
        ok = lever_coherent(str(cat), len(per), float(top.sum()), module_share)
        rows.append({"rank": int(step_totals["rank"].iloc[0]), "category": str(cat),
                     "class": CATEGORY_CLASS.get(cat, "compute"), "n_steps": n, "sum_ms_per_step": tot / 1e3 / n,
                     "recompute_ms_per_step": (float(recompute.loc[(recompute["category"] == cat).to_numpy(),
                                                                    "dur_us"].sum()) / 1e3 / n
                                               if recompute is not None else 0.0),
                     "n_names": len(per), "top_kernels": " | ".join(f"{k} ({v:.0%})" for k, v in top.items()),
                     "top_share": float(top.sum()), "top_kernel": str(top.index[0]),
                     "top_kernel_share": float(top.iloc[0]),
                     "module": mod["module"].get(cat) if cat in mod.index else None,
                     "module_share": module_share, "coherent": ok,
                     "why": _lever_why(str(cat), len(per), float(top.sum()), len(top), ok, module_share)})
    out = pd.DataFrame(rows, columns=LEVER_COLUMNS)
    return out.sort_values("sum_ms_per_step", ascending=False, kind="stable").reset_index(drop=True)


def _lever_why(category: str, n_names: int, top_share: float, n_top: int, ok: bool,
               module_share: float | None) -> str:
    """The reading behind `coherent`, said the way the test decided it."""
    from stepscope.thresholds import LEVER_DOMINANT_SHARE

    txt = f"{n_names} distinct kernels, the largest {n_top} holding {top_share:.0%}"
    if not ok:
        return txt + ": a grab-bag, not one lever"
    if category in ONE_OPERATION_CATEGORIES:
        return txt + ": one operation, whatever kernels run it"
    if module_share is not None and module_share >= LEVER_DOMINANT_SHARE:
        return txt + f"; one module holds {module_share:.0%}: a lever as that module"
    return txt


_INSTANCE_NO = re.compile(r"_\d+$")


def _decided_by(work: pd.DataFrame) -> pd.Series:
    """What put each kernel in its category: `name` (a name rule), `catch-all`, or the op or
    module it ran inside, without its instance number (`nn.Module: Qwen2RMSNorm`)."""
    s_codes, s_u = text_column_codes(work["category_source"] if "category_source" in work else None, len(work), "name")
    c_codes, c_u = text_column_codes(work["op_context"] if "op_context" in work else None, len(work), "")
    # Judged once per distinct (source, frame) pair and kept as codes: a str per row was most of stage 05's
    # peak.
    width = len(c_u) + 1  # code -1 (a missing value) becomes 0: read as "" below
    codes, pairs = factorize_keys(len(s_codes), lambda sl: (s_codes[sl].astype(np.int64) + 1) * width
                                  + (c_codes[sl] + 1), narrow=True)  # pd.factorize's codes, a slice at a time
    label = [_decision_label(s_u[p // width - 1] if p // width else "", c_u[p % width - 1] if p % width else "")
             for p in pairs]
    table = list(dict.fromkeys(label))
    at = np.array([table.index(x) for x in label], dtype=np.int8 if len(table) < 127 else np.int32)
    return pd.Series(pd.Categorical.from_codes(lookup(at, codes) if len(codes) else codes.astype(np.int32),
                                               categories=pd.Index(table, dtype=object)), index=work.index, copy=False)


def _decision_label(source: object, context: object) -> str:
    s, c = str(source), str(context)
    return ("inside " + _INSTANCE_NO.sub("", c) if s == "context" else s).replace("catch_all", "catch-all")


def decode_step_times(step_totals: pd.DataFrame, tpot_ms: float | None = None) -> dict:
    """Per decode step: kernel sum vs union (busy) vs span, side by side, and the TPOT."""
    dec, which = select_decode_steps(step_totals)
    out: dict = {"steps_used": which, "n_steps": int(len(dec))}
    for col, label in (("kernel_sum_us", "kernel_sum_ms"), ("busy_us", "union_ms"),
                       ("span_us", "span_ms"), ("annotation_dur_us", "annotation_ms")):
        v = dec[col].to_numpy(float) / 1e3 if len(dec) else np.array([])
        out[label] = {"mean": float(v.mean()) if len(v) else None,
                      "median": float(np.median(v)) if len(v) else None,
                      "p90": float(np.percentile(v, 90)) if len(v) else None}
    ok = _followed_by_same_kind(step_totals, dec)
    v = step_totals["period_us"].to_numpy(float)[ok] / 1e3 if "period_us" in step_totals else []
    v = np.asarray(v)[np.isfinite(v)] if len(v) else np.array([])
    out["period_ms"] = {"mean": float(v.mean()) if len(v) else None,
                        "median": float(np.median(v)) if len(v) else None,
                        "p90": float(np.percentile(v, 90)) if len(v) else None}
    pb = step_totals["period_busy_us"].to_numpy(float)[ok] / 1e3 if "period_busy_us" in step_totals else []
    pb = np.asarray(pb)[np.isfinite(pb)] if len(pb) else np.array([])
    out["period_busy_ms"] = ({"mean": float(pb.mean()), "median": float(np.median(pb)),
                              "p90": float(np.percentile(pb, 90))} if len(pb) else None)
    out["tpot_capture_ms"] = tpot_ms
    return out


def _followed_by_same_kind(step_totals: pd.DataFrame, chosen: pd.DataFrame) -> np.ndarray:
    """Rows of step_totals that are in `chosen` and whose next step is of the same kind:
    their period is one step's, not a gap between requests."""
    kinds = step_totals["kind"].to_numpy() if "kind" in step_totals else np.array([])
    same_next = np.r_[kinds[1:] == kinds[:-1], False] if len(kinds) else np.zeros(0, bool)
    return step_totals["step_id"].isin(chosen["step_id"]).to_numpy() & same_next


def ceiling_x(step_ms: float, removed_ms: float) -> float:
    """Amdahl's ceiling: how many times faster a step of `step_ms` gets without `removed_ms` of it (infinite
    when nothing is left). The formula's one home."""
    rest = step_ms - removed_ms
    return step_ms / rest if rest > 0 else float("inf")


def step_basis(step_times: dict) -> tuple[str | None, float | None]:
    """(denominator, ms) of every share and Amdahl ceiling: the mean decode period (what TPOT measures), else
    the mean span of a step's work, else its busy time. Chosen here only."""
    for name, key in (("period", "period_ms"), ("span", "span_ms"), ("union", "union_ms")):
        ms = (step_times.get(key) or {}).get("mean")
        if ms:
            return name, float(ms)
    return None, None


def amdahl(decode_cats: pd.DataFrame, step_times: dict) -> pd.DataFrame:
    """Per category: the speed-up of the decode step if its exposed time were zero, on
    `step_basis` (`denominator` says which)."""
    denominator, step_ms = step_basis(step_times)
    if not step_ms or decode_cats.empty:
        return pd.DataFrame(columns=["rank", "category", "class", "step_ms", "denominator",
                                     "exposed_ms", "speedup_ceiling"])
    d = decode_cats[["rank", "category", "class", "exposed_ms_mean"]].rename(
        columns={"exposed_ms_mean": "exposed_ms"})
    d.insert(3, "step_ms", step_ms)
    d.insert(4, "denominator", denominator)
    d["speedup_ceiling"] = [ceiling_x(step_ms, float(x)) for x in d["exposed_ms"]]
    return d.sort_values("speedup_ceiling", ascending=False, kind="stable").reset_index(drop=True)


def cross_rank(decode_tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Per category: min / median / max across ranks of the decode union ms per step; for a collective the
    least rank approximates the transfer, the rest being wait for the slowest rank."""
    if not decode_tables:
        return pd.DataFrame(columns=CROSS_RANK_COLUMNS)
    d = pd.concat(decode_tables, ignore_index=True)
    if d.empty:
        return pd.DataFrame(columns=CROSS_RANK_COLUMNS)
    rows = []
    for cat, g in d.groupby("category", sort=False):
        v = g.set_index("rank")["union_ms_mean"]
        is_coll = cat in COLLECTIVE_CATEGORIES
        rows.append({
            "category": cat, "class": CATEGORY_CLASS.get(cat, "compute"), "n_ranks": len(v),
            "ms_per_step_min": v.min(), "ms_per_step_median": v.median(),
            "ms_per_step_max": v.max(), "min_rank": int(v.idxmin()), "max_rank": int(v.idxmax()),
            "transfer_ms_est": v.min() if is_coll else np.nan,
            "wait_ms_median": (v.median() - v.min()) if is_coll else np.nan,
            "wait_ms_max": (v.max() - v.min()) if is_coll else np.nan,
            "note": ("min-rank time approximates the transfer; the rest is waiting for the "
                     "slowest rank" if is_coll else ""),
        })
    return pd.DataFrame(rows)[CROSS_RANK_COLUMNS].sort_values(
        "ms_per_step_median", ascending=False, kind="stable").reset_index(drop=True)


CROSS_RANK_COLUMNS = ["category", "class", "n_ranks", "ms_per_step_min", "ms_per_step_median",
                      "ms_per_step_max", "min_rank", "max_rank", "transfer_ms_est",
                      "wait_ms_median", "wait_ms_max", "note"]


def observed_collectives(step_totals: pd.DataFrame) -> dict:
    """Collective calls per decode step (median, min, max over the decode steps)."""
    dec, which = select_decode_steps(step_totals)
    out = {"steps_used": which, "n_steps": int(len(dec))}
    for c in ("all_reduce", "all_gather", "other_collective"):
        v = dec[f"{c}_calls"].to_numpy() if len(dec) else np.array([0])
        out[c] = {"median": float(np.median(v)), "min": int(v.min()), "max": int(v.max())}
    return out
