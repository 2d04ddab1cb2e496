"""Per-level latency samples for distribution figures: every request's TPOT and every ITL gap.

The levels table keeps percentiles; a distribution shows what they hide (two modes, a long
tail, a level whose ITL is pooled over merged chunks). The samples come from the raw
records in `levels/*.jsonl` through the metrics module's own definitions, so a figure and
the table never disagree about what a TPOT or an ITL is.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from stepscope.runfolder import read_json
from stepscope.sweep.metrics import itl_ms, request_table
from stepscope.sweep.run import read_level_records

SAMPLE_COLUMNS = ["level", "concurrency", "metric", "value_ms"]
"""Long form: one row per request (metric `tpot`) or per inter-chunk gap (metric `itl`)."""


def latency_samples(out_dir: str | Path) -> pd.DataFrame:
    """TPOT per completed request and every ITL gap (ms) of each closed-loop level in
    `out_dir/levels/` (stage 01's folder). Open-loop levels are left out: they have no
    concurrency to place them on."""
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
