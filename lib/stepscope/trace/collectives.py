"""Collectives matched across ranks: who arrived when, how long the transfer took.

An instance (one collective kernel, or a CPU entry op with its wrapper and wait) is matched across ranks in
issue order per category; each rank's time splits exactly into wait and completion after the last arrival.
Method and sources: docs/trace-analysis.md#collectives-matched-across-ranks.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from stepscope.thresholds import CLOCK_SKEW_LIMIT_US, READINGS_AGREE_REL
from stepscope.trace.account import covered_length, end_us, in_steps, picked, rows_of
from stepscope.trace.codes import count_codes, factorize_keys, group_medians, lookup, text_column_codes
from stepscope.trace.categorize import COLLECTIVE_CATEGORIES
from stepscope.trace.widths import narrow_ints

_DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "half": 2, "f16": 2, "fp16": 2, "float16": 2,
                "float": 4, "f32": 4, "fp32": 4, "float32": 4, "double": 8, "f64": 8,
                "int8_t": 1, "uint8_t": 1, "int8": 1, "uint8": 1, "int32_t": 4, "uint32_t": 4,
                "int64_t": 8, "uint64_t": 8, "fp8": 1, "f8e4m3": 1, "f8e5m2": 1,
                # ATen's scalar type names, as record_param_comms writes them in `dtype`
                "long": 8, "int": 4, "short": 2, "byte": 1, "char": 1, "bool": 1,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1}
_NCCL_DTYPE = re.compile(r"_(bf16|half|f16|f32|f64|float|double|u?int(?:8|32|64)_t|fp8|f8e4m3|f8e5m2)"
                         r"(?=[_(]|$)", re.I)
PROLOGUE_GAP_US = 1.0
"""A communication piece that ends within this of a collective call's start is that call's
prologue (the `_c10d_functional` wrapper's self time before its `c10d::` child)."""

INSTANCE_COLUMNS = ["instance", "category", "step_id", "step_kind", "n_ranks", "first_arrival_us",
                    "last_arrival_us", "last_rank", "skew_us", "completion_us", "transfer_us", "asymmetric",
                    "nelems", "dtype", "bytes", "bytes_source", "algbw_gbps", "busbw_gbps"]


def dtype_from_kernel(name: str) -> str | None:
    """The element type in an NCCL kernel name (`..._Sum_bf16...`, `..._Sum_float(`)."""
    m = _NCCL_DTYPE.search(name)
    return m.group(1).lower() if m else None


def bus_factor(category: str, n: int) -> float:
    """nccl-tests' busbw / algbw for a collective over n ranks."""
    if n <= 1:
        return 1.0
    if category == "all_reduce":
        return 2.0 * (n - 1) / n
    if category == "all_gather":
        return (n - 1) / n
    return 1.0


def rank_instances(work: pd.DataFrame, kinds: dict[int, str], offset_us: float) -> pd.DataFrame:
    """One rank's collective instances in issue order: category, step, arrival, end, size."""
    comm = work[work["category"].isin(COLLECTIVE_CATEGORIES)]
    cols = ["category", "step_id", "step_kind", "arrival_us", "end_us", "nelems", "dtype", "stream"]
    if comm.empty or not comm["collective_call"].any():
        return pd.DataFrame(columns=cols)
    parts = []
    for stream, g in comm.groupby("stream", sort=False):
        g = g.sort_values("start_us", kind="stable")
        call = g["collective_call"].to_numpy()
        start = g["start_us"].to_numpy(float)
        end = end_us(g)
        inst = np.cumsum(call) - 1
        nxt_call = np.r_[call[1:], False]
        nxt_start = np.r_[start[1:], np.inf]
        prologue = ~call & nxt_call & (nxt_start - end <= PROLOGUE_GAP_US)
        inst = np.where(prologue, inst + 1, inst)
        g = g.assign(_inst=inst, end_us=end)
        g = g[g["_inst"] >= 0]
        calls = g[g["collective_call"]].set_index("_inst")
        agg = g.groupby("_inst").agg(arrival_us=("start_us", "min"), end_us=("end_us", "max"))
        agg["category"] = calls["category"]
        agg["step_id"] = calls["step_id"].astype(int)
        agg["nelems"] = calls["msg_nelems"]
        agg["dtype"] = [dtype_from_kernel(n) for n in calls["name"].astype(str)]
        agg["stream"] = stream
        parts.append(agg)
    out = pd.concat(parts, ignore_index=True)
    out["arrival_us"] += offset_us
    out["end_us"] += offset_us
    out["step_kind"] = out["step_id"].map(kinds).fillna("none")
    return out.sort_values("arrival_us", kind="stable").reset_index(drop=True)[cols]


def _bytes(category: str, nelems: int, dtype: str | None, n: int,
           fallback_bytes: float | None) -> tuple[float | None, str]:
    if nelems is not None and nelems >= 0 and dtype in _DTYPE_BYTES:
        b = float(nelems) * _DTYPE_BYTES[dtype]
        return (b * n if category == "all_gather" else b), "In msg nelems x kernel dtype"
    if fallback_bytes:
        return float(fallback_bytes), "architecture (tokens x hidden x dtype)"
    return None, "unknown (no message size in the trace)"


def match_instances(per_rank: dict[int, pd.DataFrame], world: int,
                    bytes_for: Any = None) -> tuple[pd.DataFrame, dict]:
    """Match instances across ranks per category in issue order: (instances table, notes {count_mismatch:
    {category: {rank: count}}}); `bytes_for(category, step_kind)` sizes unrecorded messages."""
    ranks = sorted(per_rank)
    ref = ranks[0]
    rows, mismatch = [], {}
    for cat in COLLECTIVE_CATEGORIES:
        seqs = {r: per_rank[r][per_rank[r]["category"] == cat].reset_index(drop=True) for r in ranks}
        counts = {r: len(s) for r, s in seqs.items()}
        if len(set(counts.values())) > 1:
            mismatch[cat] = counts
        n = min(counts.values())
        for i in range(n):
            arr = np.array([seqs[r]["arrival_us"].iloc[i] for r in ranks])
            end = np.array([seqs[r]["end_us"].iloc[i] for r in ranks])
            head = seqs[ref].iloc[i]
            last = int(np.argmax(arr))
            asym = bool(end.min() < arr.max())
            transfer = float("nan") if asym else float(np.median(end) - arr.max())
            nb, src = _bytes(cat, int(head["nelems"]), head["dtype"], world,
                             bytes_for(cat, head["step_kind"]) if bytes_for else None)
            algbw = nb / transfer / 1e3 if nb and transfer > 0 else None  # B/µs / 1e3 = GB/s
            row = {"instance": len(rows), "category": cat, "step_id": int(head["step_id"]),
                   "step_kind": head["step_kind"], "n_ranks": len(ranks),
                   "first_arrival_us": float(arr.min()), "last_arrival_us": float(arr.max()),
                   "last_rank": ranks[last], "skew_us": float(arr.max() - arr.min()),
                   "completion_us": float(np.median(end)), "transfer_us": transfer, "asymmetric": asym,
                   "nelems": int(head["nelems"]), "dtype": head["dtype"], "bytes": nb,
                   "bytes_source": src, "algbw_gbps": algbw,
                   "busbw_gbps": algbw * bus_factor(cat, world) if algbw else None}
            for k, r in enumerate(ranks):
                row[f"arrival_us_r{r}"] = float(arr[k])
                row[f"end_us_r{r}"] = float(end[k])
                # A rank that left before the last arrival waited only until it left.
                row[f"wait_us_r{r}"] = float(min(arr.max(), end[k]) - arr[k])
                row[f"after_us_r{r}"] = float(max(end[k] - arr.max(), 0.0))
            rows.append(row)
    extra = [f"{p}_r{r}" for r in ranks for p in ("arrival_us", "end_us", "wait_us", "after_us")]
    table = pd.DataFrame(rows, columns=INSTANCE_COLUMNS + extra)
    return table, {"count_mismatch": mismatch}


def _clock_flag(table: pd.DataFrame, ranks: list[int]) -> dict | None:
    """Ranks whose matched collectives end (median) further from the reference than the limit."""
    if table.empty or len(ranks) < 2:
        return None
    ref = ranks[0]
    off = {r: float(np.median(table[f"end_us_r{r}"] - table[f"end_us_r{ref}"])) for r in ranks[1:]}
    bad = {r: v for r, v in off.items() if abs(v) > CLOCK_SKEW_LIMIT_US}
    return {"ranks": sorted(bad), "median_end_offset_us": off} if bad else None


def summarize(table: pd.DataFrame, ranks: list[int], world: int | None, judged_kind: str,
              n_judged_steps: int, notes: dict) -> dict:
    """The `collectives_matched` block of summary.json."""
    out: dict = {"world_size": world, "ranks_present": ranks,
                 "complete": bool(world and len(ranks) >= world and len(ranks) > 1),
                 "n_instances": int(len(table)), "steps_used": judged_kind,
                 "transfer_ms_per_step": None, "wait_ms_per_step": None, "wait_ms_per_step_by_rank": None,
                 "skew_us": {"p50": None, "p90": None}, "transfer_us": {"p50": None, "p90": None},
                 "straggler_rank": None, "straggler_share": None, "busbw_gbps": {"p50": None},
                 "clock_flag": None, **notes}
    if table.empty:
        return out
    sel = table[table["step_kind"] == judged_kind] if judged_kind else table
    if sel.empty:
        return out
    n = max(n_judged_steps, 1)
    waits = {r: float(sel[f"wait_us_r{r}"].sum() / n / 1e3) for r in ranks}
    afters = {r: float(sel[f"after_us_r{r}"].sum() / n / 1e3) for r in ranks}
    last = sel["last_rank"].value_counts()
    bw = sel["busbw_gbps"].dropna()
    out.update({
        "n_instances_judged": int(len(sel)),
        "n_asymmetric": int(sel["asymmetric"].sum()),
        "transfer_ms_per_step": float(sel["transfer_us"].sum() / n / 1e3),
        "wait_ms_per_step": float(np.mean(list(waits.values()))),
        "wait_ms_per_step_by_rank": {str(r): v for r, v in waits.items()},
        "after_last_arrival_ms_per_step_by_rank": {str(r): v for r, v in afters.items()},
        "matched_ms_per_step_by_rank": {str(r): waits[r] + afters[r] for r in ranks},
        "skew_us": {"p50": float(sel["skew_us"].quantile(0.5)), "p90": float(sel["skew_us"].quantile(0.9))},
        "transfer_us": {"p50": float(sel["transfer_us"].quantile(0.5)),
                        "p90": float(sel["transfer_us"].quantile(0.9))},
        "straggler_rank": int(last.index[0]),
        "straggler_share": float(last.iloc[0] / len(sel)),
        "busbw_gbps": {"p50": float(bw.median()) if len(bw) else None},
        "clock_flag": _clock_flag(sel, ranks),
        "by_category": {cat: _category_stats(g, ranks, n) for cat, g in sel.groupby("category")},
    })
    return out


def _category_stats(g: pd.DataFrame, ranks: list[int], n_steps: int) -> dict:
    return {"n_instances": int(len(g)), "n_asymmetric": int(g["asymmetric"].sum()),
            "skew_us": {"p50": float(g["skew_us"].quantile(0.5)), "p90": float(g["skew_us"].quantile(0.9))},
            "transfer_us": {"p50": _q(g["transfer_us"], 0.5), "p90": _q(g["transfer_us"], 0.9)},
            "transfer_ms_per_step": float(g["transfer_us"].sum() / n_steps / 1e3),
            "wait_ms_per_step_by_rank": {str(r): float(g[f"wait_us_r{r}"].sum() / n_steps / 1e3)
                                         for r in ranks},
            "after_last_arrival_ms_per_step_by_rank": {
                str(r): float(g[f"after_us_r{r}"].sum() / n_steps / 1e3) for r in ranks},
            "straggler_rank": int(g["last_rank"].value_counts().index[0]),
            "bytes_p50": _q(g["bytes"], 0.5), "busbw_gbps_p50": _q(g["busbw_gbps"], 0.5)}


def _q(v: pd.Series, q: float) -> float | None:
    v = pd.to_numeric(v, errors="coerce").dropna()
    return float(v.quantile(q)) if len(v) else None


def reconcile(matched_ms: dict[str, float], accounted_ms: dict[str, float | None],
              inside: dict[str, dict[str, float]] | None = None) -> dict:
    """Each rank's matched wait + after per step beside its collective categories' time; `inside`
    (`instance_gaps`) says how much idle and other work its instances hold, where the two readings differ."""
    rows = {}
    for r, m in matched_ms.items():
        a = accounted_ms.get(r)
        rel = abs(m - a) / a if a else None
        rows[r] = {"matched_ms": m, "accounted_ms": a, "rel_diff": rel,
                   "agree": None if rel is None else bool(rel <= READINGS_AGREE_REL),
                   **((inside or {}).get(r) or {})}
    return rows


def instance_gaps(work: pd.DataFrame, inst: pd.DataFrame, offset_us: float) -> dict[str, float]:
    """Inside one rank's collective instances (times shifted by `offset_us`): µs no collective work covers,
    split into other categories' work on the same stream or thread and time with no recorded op."""
    idle = other = 0.0
    for stream, g in inst.groupby("stream", sort=False):
        a = g["arrival_us"].to_numpy(float) - offset_us
        b = g["end_us"].to_numpy(float) - offset_us
        on = work[work["stream"] == stream]
        comm = on["category"].isin(COLLECTIVE_CATEGORIES).to_numpy()
        s, e = on["start_us"].to_numpy(float), end_us(on)
        all_cov = covered_length(s, e, a, b)
        comm_cov = covered_length(s[comm], e[comm], a, b)
        idle += float((b - a).sum()) - all_cov
        other += all_cov - comm_cov
    return {"inside_idle_us": idle, "inside_other_us": other}


def per_step(table: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    """Per reference-rank step: transfer, the reference rank's wait and completion after the last arrival, the
    wait averaged over ranks (ms), and the straggler."""
    cols = ["step_id", "transfer_ms", "wait_ms", "after_ms", "wait_mean_ms", "straggler_rank"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    g = table.groupby("step_id")
    out = pd.DataFrame({
        "transfer_ms": g["transfer_us"].sum() / 1e3,
        "wait_ms": g[f"wait_us_r{ranks[0]}"].sum() / 1e3,
        "after_ms": g[f"after_us_r{ranks[0]}"].sum() / 1e3,
        "wait_mean_ms": g[[f"wait_us_r{r}" for r in ranks]].sum().mean(axis=1) / 1e3,
        "straggler_rank": g["last_rank"].agg(lambda s: int(s.value_counts().index[0])),
    })
    return out.reset_index()


# --------------------------------------------------------------------------- one rank's sizes

SIZE_COLUMNS = ["rank", "collective", "category", "dtype", "dtype_source", "nelems", "bytes", "group_size",
                "process_group", "n_steps", "calls_per_step", "us_per_call_median", "algbw_gbps", "busbw_gbps"]
_KERNEL_COLLECTIVE = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)", re.I)
_ISSUING_OP = re.compile(r"^(?:nccl:|c10d::|_c10d_functional::|gloo:)(\w+)")
_CANONICAL = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
              ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("broadcast", "broadcast"),
              ("send", "send"), ("recv", "recv"), ("barrier", "barrier"), ("reduce", "reduce"))


def collective_name(arg: str | None, op_context: str | None, kernel: str) -> str | None:
    """The canonical collective a kernel runs (`all_reduce`, `broadcast`, ...): its `Collective name` arg,
    else its issuing `nccl:` / `c10d::` op, else its own name; None if none says."""
    m = _ISSUING_OP.match(op_context or "")
    k = _KERNEL_COLLECTIVE.search(kernel)
    for raw in (arg, m.group(1) if m else None, k.group(1) if k and k.group(1).lower() != "generic" else None):
        if raw:
            token = re.sub(r"[^a-z]", "", raw.lower())
            return next((c for key, c in _CANONICAL if token.startswith(key) or token == key.replace("_", "")),
                        token)
    return None


def bus_factor_of(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw by collective: 2(n-1)/n for all-reduce, (n-1)/n for all-gather
    and reduce-scatter, 1 otherwise (broadcast, send/recv)."""
    if n <= 1:
        return 1.0
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    return (n - 1) / n if collective in ("all_gather", "reduce_scatter") else 1.0


def _size_keys(w: pd.DataFrame, arg_names: pd.Series | None, world: int | None
               ) -> tuple[pd.DataFrame, np.ndarray]:
    """(collective, category, dtype and its source, group size, process group) judged once per distinct (args,
    issuing op, kernel name, category), and per collective row its row of that table."""
    from stepscope.trace.parse import collective_args

    n = len(w)
    parts = [text_column_codes(arg_names.reset_index(drop=True) if arg_names is not None else None, n),
             text_column_codes(w["op_context"] if "op_context" in w else None, n),
             text_column_codes(w["name"], n), text_column_codes(w["category"], n)]

    def key(sl: slice) -> np.ndarray:  # one int per (args, op, kernel, category), a slice at a time
        out = np.zeros(len(parts[0][0][sl]), dtype=np.int64)
        for codes, values in parts:
            out = out * (len(values) + 1) + (codes[sl] + 1)
        return out

    k_codes, k_u = factorize_keys(n, key, narrow=True)  # numbered as pd.factorize numbers them
    rows = []
    for k in k_u:
        vals = []
        for codes, values in reversed(parts):
            i = int(k % (len(values) + 1)) - 1
            k //= len(values) + 1
            vals.append("" if i < 0 or values[i] is None or values[i] != values[i] else str(values[i]))
        category, name, ctx, raw = vals
        a = collective_args(raw)
        kdt = dtype_from_kernel(name)
        rows.append({"collective": collective_name(a[0], ctx, name) or category, "category": category,
                     "dtype": a[1].lower() or (kdt or ""),
                     "dtype_source": "args" if a[1] else ("kernel name" if kdt else ""),
                     "group_size": a[2] if a[2] else (world or -1), "process_group": a[3]})
    table = pd.DataFrame(rows, columns=_SIZE_KEY_COLUMNS)
    return table, k_codes


_SIZE_KEY_COLUMNS = ["collective", "category", "dtype", "dtype_source", "group_size", "process_group"]


def _size_groups(w: pd.DataFrame, table: pd.DataFrame, k_codes: np.ndarray) -> pd.DataFrame:
    """Per size key in order of first appearance: calls (`count`) and the `median` kernel time, keyed by one
    int rather than a groupby over seven columns."""
    tuple_of = table.groupby(_SIZE_KEY_COLUMNS, sort=False, dropna=False).ngroup().to_numpy(np.int64)
    first_of = np.unique(tuple_of, return_index=True)[1]  # each tuple's first table row (ids 0..k-1)
    ne = w["msg_nelems"].to_numpy()
    tid = lookup(narrow_ints(tuple_of), k_codes)
    width = int(ne.max()) + 2 if len(ne) and ne.max() >= 0 else 1
    codes, uniq = factorize_keys(len(tid), lambda sl: tid[sl].astype(np.int64) * width
                                 + (np.maximum(ne[sl].astype(np.int64), -1) + 1), narrow=True)
    med = group_medians(codes, w["dur_us"].to_numpy(float), len(uniq))
    out = table.iloc[first_of[uniq // width]].reset_index(drop=True)
    out.insert(4, "nelems", uniq % width - 1)
    return out.assign(count=count_codes(codes, len(uniq)), median=med)


def collective_sizes(work: pd.DataFrame, arg_names: pd.Series | None, step_ids: np.ndarray,
                     world: int | None, rank: int) -> pd.DataFrame:
    """One rank's collective kernels over `step_ids` by collective, dtype and message size: calls per step,
    median kernel time and the nccl-tests algbw/busbw it implies (one rank's time, waiting included). The
    args' dtype wins over the kernel name's: NCCL moves a broadcast as bytes whatever the tensor's type."""
    sel = in_steps(work["step_id"].to_numpy(), step_ids)
    sel &= work["collective_call"].to_numpy(bool)  # in place: no second mask per row
    # the columns read, not a copy of every work column
    w = rows_of(work, sel, ["category", "name", "op_context", "msg_nelems", "dur_us"])
    n = len(step_ids)
    if w.empty or not n:
        return pd.DataFrame(columns=SIZE_COLUMNS)
    args = pd.Series(picked(arg_names, sel), copy=False) if arg_names is not None else None  # no index per row
    out = _size_groups(w, *_size_keys(w, args, world))
    for c in ("dtype", "dtype_source", "process_group"):
        out[c] = out[c].replace("", None)
    ne = out["nelems"].to_numpy()
    gs = out["group_size"].to_numpy()
    out["bytes"] = pd.array([_bytes(cat, int(e), dt, max(int(g), 1), None)[0] if e >= 0 else None
                             for cat, e, dt, g in zip(out["category"], ne, out["dtype"], gs)], dtype="Float64")
    out["nelems"] = pd.array([int(e) if e >= 0 else None for e in ne], dtype="Int64")
    out["group_size"] = pd.array([int(g) if g > 0 else None for g in gs], dtype="Int64")
    alg = [b / us / 1e3 if pd.notna(b) and b and us > 0 else None for b, us in zip(out["bytes"], out["median"])]
    out["algbw_gbps"] = pd.array(alg, dtype="Float64")
    out["busbw_gbps"] = pd.array([a * bus_factor_of(c, int(g) if g > 0 else 1) if a else None
                                  for a, c, g in zip(alg, out["collective"], gs)], dtype="Float64")
    out = out.assign(rank=rank, n_steps=n, calls_per_step=out["count"] / n, us_per_call_median=out["median"])
    return out.sort_values(["calls_per_step", "collective"], ascending=[False, True], kind="stable")[
        SIZE_COLUMNS].reset_index(drop=True)
