"""Time by module: which part of the model each kernel ran for.

Each module instance gets its path of classes (`Qwen2MLP/Linear#0`), instance numbers dropped so repeated
layers add up; `module_table` sums each path's own and total device work over the judged steps. Method:
docs/trace-analysis.md#time-by-module.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from stepscope.trace.frames import MODULE_PREFIX
from stepscope.trace.account import in_steps

MODULE_COLUMNS = ["rank", "path", "module", "depth", "n_instances", "n_steps", "calls_per_step",
                  "self_ms_per_step", "sum_ms_per_step", "recompute_ms_per_step", "share_of_device",
                  "top_category", "top_category_share"]
_INSTANCE = re.compile(r"_\d+$")


def module_paths(ev: pd.DataFrame) -> dict[str, str]:
    """{module instance (`Linear_31`): its path (`Qwen2ForCausalLM/Qwen2Model/.../Qwen2MLP/Linear#2`)}
    from the nesting of the rank's module frames (the first call of each instance decides)."""
    # .str on the name column as it is (Categorical): judged once per distinct name, no copy per row
    fr = ev[(ev["cat"] == "python_function") & ev["name"].str.startswith(MODULE_PREFIX)]
    if fr.empty:
        return {}
    fr = fr.assign(end=fr["ts"] + fr["dur"], neg=-fr["dur"]).sort_values(["pid", "tid", "ts", "neg"],
                                                                       kind="stable")
    parent: dict[str, str] = {}
    children: dict[str, list[str]] = {}
    for _, g in fr.groupby(["pid", "tid"], sort=False):
        stack: list[tuple[float, str]] = []
        for name, ts, end in zip(g["name"].astype(str), g["ts"].to_numpy(float), g["end"].to_numpy(float)):
            inst = name[len(MODULE_PREFIX):]
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if inst not in parent:
                up = stack[-1][1] if stack else ""
                parent[inst] = up
                children.setdefault(up, []).append(inst)
            stack.append((end, inst))
    label = _labels(children)
    paths: dict[str, str] = {}

    def path(inst: str) -> str:
        if inst not in paths:
            up = parent.get(inst, "")
            paths[inst] = (path(up) + "/" if up else "") + label[inst]
        return paths[inst]

    for inst in parent:
        path(inst)
    return paths


ROLE_SIBLINGS_MAX = 8
"""At most this many leaf siblings of one class are told apart by call order (q/k/v/o, gate/up/down); more are
repeats of one block and share a row."""


def _labels(children: dict[str, list[str]]) -> dict[str, str]:
    """Each instance's class name, with `#k` (call order among its parent's children of the
    same class) where the parent calls a few leaf modules of that class in different roles."""
    out: dict[str, str] = {}
    for kids in children.values():
        classes = [_INSTANCE.sub("", k) for k in kids]
        seen: dict[str, int] = {}
        for k, c in zip(kids, classes):
            same = [x for x, cx in zip(kids, classes) if cx == c]
            roles = 1 < len(same) <= ROLE_SIBLINGS_MAX and not any(children.get(x) for x in same)
            out[k] = f"{c}#{seen.get(c, 0)}" if roles else c
            seen[c] = seen.get(c, 0) + 1
    return out


def module_table(work: pd.DataFrame, paths: dict[str, str], step_ids: np.ndarray, rank: int) -> pd.DataFrame:
    """Per module path over the steps `step_ids`: device work per step, its own and inclusive
    (ms, summed), its share of the steps' summed device time, and its largest category."""
    n = len(step_ids)
    if not paths or not n:  # before the rows are copied: most GPU traces have no module frames
        return pd.DataFrame(columns=MODULE_COLUMNS)
    w = work[in_steps(work["step_id"].to_numpy(), step_ids)]
    if w.empty:
        return pd.DataFrame(columns=MODULE_COLUMNS)
    own = w["module"].map(paths)
    w = w.assign(path=own).dropna(subset=["path"])
    if w.empty:
        return pd.DataFrame(columns=MODULE_COLUMNS)
    total_us = float(work.loc[work["step_id"].isin(step_ids), "dur_us"].sum())
    # every work row counts for its own path and each path above it
    parts = w["path"].str.split("/")
    depth = parts.str.len()
    rows = []
    for d in range(1, int(depth.max()) + 1):
        at = depth >= d
        rows.append(w[at].assign(prefix=parts[at].str[:d].str.join("/"), is_self=(depth[at] == d)))
    long = pd.concat(rows, ignore_index=True)
    inst = pd.Series(paths).reset_index().rename(columns={"index": "inst", 0: "prefix"})
    n_inst = inst.groupby("prefix")["inst"].nunique()
    long["self_us"] = np.where(long["is_self"], long["dur_us"], 0.0)
    long["re_us"] = np.where(long["recompute"], long["dur_us"], 0.0) if "recompute" in long else 0.0
    g = long.groupby("prefix", sort=False)
    by_cat = long.groupby(["prefix", "category"], sort=False)["dur_us"].sum().reset_index()
    top = by_cat.sort_values("dur_us", ascending=False, kind="stable").drop_duplicates("prefix").set_index("prefix")
    out = pd.DataFrame({
        "calls_per_step": g["is_self"].sum() / n,
        "self_ms_per_step": g["self_us"].sum() / 1e3 / n,
        "sum_ms_per_step": g["dur_us"].sum() / 1e3 / n,
        "recompute_ms_per_step": g["re_us"].sum() / 1e3 / n,
    }).reset_index().rename(columns={"prefix": "path"})
    out["module"] = out["path"].str.rsplit("/", n=1).str[-1]
    out["depth"] = out["path"].str.count("/") + 1
    out["n_instances"] = out["path"].map(n_inst).fillna(0).astype(int)
    out["n_steps"] = n
    out["share_of_device"] = out["sum_ms_per_step"] * 1e3 * n / total_us if total_us else 0.0
    out["top_category"] = out["path"].map(top["category"])
    out["top_category_share"] = out["path"].map(top["dur_us"]) / (out["sum_ms_per_step"] * 1e3 * n)
    out["rank"] = rank
    out = out.sort_values(["sum_ms_per_step", "path"], ascending=[False, True], kind="stable")
    return out[MODULE_COLUMNS].reset_index(drop=True)


def leaf_modules(table: pd.DataFrame, top: int = 15) -> pd.DataFrame:
    """The `top` paths with the most work of their own (for the figure): where the time is
    spent, not which containers hold it."""
    if table.empty:
        return table
    t = table[table["self_ms_per_step"] > 0]
    return t.sort_values("self_ms_per_step", ascending=False, kind="stable").head(top).reset_index(drop=True)


RECOMPUTE_FRAME = re.compile(r"checkpoint\.py\(\d+\): recompute_fn$")
"""Activation checkpointing (non-reentrant, `torch.utils.checkpoint`): the backward pass reruns
the checkpointed forward inside this frame; what it launches there is recompute."""


def in_recompute_frames(ev: pd.DataFrame, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Per point (pid, tid, ts): inside a `recompute_fn` frame on its thread, i.e. activation-checkpoint
    recompute rather than the first forward."""
    out = np.zeros(len(ts), dtype=bool)
    fr = ev[ev["cat"] == "python_function"]  # the names of these rows only: a mask per event otherwise
    fr = fr[fr["name"].str.contains(RECOMPUTE_FRAME)]
    if fr.empty or not len(ts):
        return out
    ts = np.asarray(ts, dtype=float)
    for f_pid, f_tid, f_ts, f_dur in fr[["pid", "tid", "ts", "dur"]].itertuples(index=False):
        out |= (pid == f_pid) & (tid == f_tid) & (ts >= f_ts) & (ts <= f_ts + f_dur)
    return out
