"""Per-level latency samples for distribution figures: every request's TPOT and every ITL gap, from the raw
records through the metrics module's definitions, so figure and table agree."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from stepscope.runfolder import read_json
from stepscope.sweep.metrics import itl_ms, request_table
from stepscope.sweep.run import read_level_records

SAMPLE_COLUMNS = ["level", "concurrency", "metric", "value_ms"]
"""Long form: one row per request (metric `tpot`) or per inter-chunk gap (metric `itl`)."""


def latency_samples(out_dir: str | Path) -> pd.DataFrame:
    """TPOT per completed request and every ITL gap (ms) of each closed-loop level in `out_dir/levels/`;
    open-loop levels have no concurrency to place them on."""
    frames = []
    for meta_path in sorted((Path(out_dir) / "levels").glob("*.meta.json")):
        meta = read_json(meta_path)
        jsonl = meta_path.with_name(f"{meta['level']}.jsonl")
        if meta.get("mode") != "concurrency" or not jsonl.is_file():
            continue
        records = read_level_records(jsonl)
        tpot = request_table(records)["tpot_ms"].dropna().to_numpy()
        for metric, values in (("tpot", tpot), ("itl", itl_ms(records))):
            frames.append(pd.DataFrame({"level": meta["level"], "concurrency": int(meta["concurrency"]),
                                        "metric": metric, "value_ms": values}))
    if not frames:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    return pd.concat(frames, ignore_index=True)[SAMPLE_COLUMNS]
