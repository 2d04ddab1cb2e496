"""Parser for torch.profiler's `key_averages().table()` text (`profiler_out_*.txt`).

Only a cross-check (docs/methods.md#the-profilers-text-table): the footer's `Self CUDA time total` is the true kernel
sum and is compared with the trace's; the per-row `Self CUDA` of CPU ops repeats their
kernels' time and is never added up.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from stepscope.filenames import rank_from_filename
from stepscope.thresholds import TEXT_TABLE_DIFF_LIMIT

_RULE = re.compile(r"^-+(\s+-+)+\s*$")
_TIME = re.compile(r"^(-?[\d.]+)\s*(us|ms|s)$")
_FOOT = re.compile(r"^Self (CPU|CUDA|XPU|MTIA|PrivateUse1) time total:\s*(\S+)")
_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}


def parse_time_us(text: str) -> float | None:
    m = _TIME.match(text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_text_table(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """(rows, footer) of one table. Columns are sliced by the dashed rule, not the header
    (header labels overflow their column); times become `<label>_us` floats."""
    lines = Path(path).read_text(errors="replace").splitlines()
    rules = [i for i, ln in enumerate(lines) if _RULE.match(ln)]
    footer: dict = {}
    for ln in lines:
        m = _FOOT.match(ln.strip())
        if m:
            footer[f"self_{m.group(1).lower()}_total_us"] = parse_time_us(m.group(2))
    if len(rules) < 2:
        return pd.DataFrame(), footer
    rule = lines[rules[0]]
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    header_line = lines[rules[0] + 1]
    labels = []
    for k, (a, b) in enumerate(spans):
        # Right-aligned labels may spill left into the gap: read to the previous column's end.
        lo = spans[k - 1][1] if k else 0
        labels.append(header_line[lo:b].strip())
    end = rules[2] if len(rules) > 2 else len(lines)
    rows = []
    for ln in lines[rules[1] + 1:end]:
        if not ln.strip():
            continue
        cells = {}
        for k, (a, b) in enumerate(spans):
            lo = spans[k - 1][1] if k else 0
            cells[labels[k]] = ln[lo:b].strip()
        rows.append(cells)
    df = pd.DataFrame(rows)
    for col in list(df.columns):
        if col == "Name" or col == "Input Shapes":
            continue
        vals = df[col].astype(str)
        if vals.str.endswith("%").all():
            df[col] = pd.to_numeric(vals.str.rstrip("%"), errors="coerce")
        elif vals.map(lambda v: parse_time_us(v) is not None).all():
            df[col.replace(" ", "_") + "_us"] = vals.map(parse_time_us)
            df = df.drop(columns=[col])
        elif col == "# of Calls":
            df["calls"] = pd.to_numeric(vals, errors="coerce")
            df = df.drop(columns=[col])
    df["truncated_name"] = df["Name"].str.endswith("...")
    df["layout"] = "gpu" if any("CUDA" in c for c in df.columns) else "cpu"
    return df, footer


def check_text_tables(tables: list[Path], ranks: dict) -> tuple[pd.DataFrame, list[dict]]:
    """Parse each table and compare it with its rank's trace: on the GPU layout the trace's kernel sum against
    the footer's `Self CUDA time total` (flagged above 1 %); the CPU layout's footer as is."""
    frames = []
    checks: list[dict] = []
    for p in tables:
        try:
            df, footer = parse_text_table(p)
        except (OSError, ValueError) as exc:
            checks.append({"file": str(p), "error": str(exc)})
            continue
        rank = rank_from_filename(p)
        df.insert(0, "file", p.name)
        df.insert(1, "rank", rank)
        frames.append(df)
        c: dict = {"file": str(p), "rank": rank, "rows": int(len(df)),
                   "layout": df["layout"].iloc[0] if len(df) else None, **footer}
        cuda_total = footer.get("self_cuda_total_us")
        r = ranks.get(rank) if rank is not None else None
        if cuda_total is not None and r is not None and r.mode == "gpu":
            ks = float(r.totals["kernel_sum_us"])
            c["trace_kernel_sum_us"] = ks
            c["rel_diff"] = (ks - cuda_total) / cuda_total if cuda_total else None
            if c["rel_diff"] is not None and abs(c["rel_diff"]) > TEXT_TABLE_DIFF_LIMIT:
                c["flag"] = {"code": "text_table_mismatch", "severity": "warning",
                             "message": f"{p.name}: Self CUDA time total {cuda_total:.0f} us vs "
                                        f"trace kernel sum {ks:.0f} us ({c['rel_diff']:+.1%})"}
        else:
            c["note"] = ("CPU layout: the table has no kernel total; it is shown for reference, "
                         "its per-op Self CPU covers the whole capture (not only steps)"
                         if cuda_total is None else "no matching GPU rank to compare with")
            if r is not None and r.mode == "cpu" and "calls" in df:
                # Collective calls: the table counts the whole capture, the trace the steps.
                w = r.work[r.work["is_call"].to_numpy()]
                in_trace = w.groupby("name").size()
                rows = df[df["Name"].str.startswith("c10d::") & ~df["truncated_name"]]
                comp = [{"name": n, "calls_table": int(k), "calls_trace_in_steps": int(in_trace.get(n, 0))}
                        for n, k in rows.groupby("Name")["calls"].sum().items()]
                c["collective_calls"] = comp
                diff = [x for x in comp if x["calls_table"] != x["calls_trace_in_steps"]]
                if diff:
                    c["flag"] = {"code": "text_table_mismatch", "severity": "info",
                                 "message": f"{p.name}: collective calls differ between the table "
                                            f"(whole capture) and the trace's steps: {diff}"}
        checks.append(c)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), checks
