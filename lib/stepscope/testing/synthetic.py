"""A small hand-made run folder that follows every artifact's schema, with invented numbers, for tests and
report previews; switches change the story so a test can check the verdict follows the data."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from stepscope import schema
from stepscope.trace.account import ceiling_x

ALL_STAGES = ("00_deploy", "01_macro_sweep", "02_gemm_micro", "03_nccl_burst",
              "04_profiler_capture", "05_categorize")


def make_synthetic_run(run_dir: str | Path, *, stages: tuple[str, ...] = ALL_STAGES,
                       comm_exposed: bool = True, launch_bound: bool = False,
                       scale: float = 1.0, plateau: bool = True, kind: str = "decode",
                       stall: bool = False, ranks_missing: bool = False,
                       contract_keys: bool = True) -> Path:
    """Write a synthetic run folder and return its path.

    comm_exposed: all-reduce runs with nothing overlapping it (else compute hides most of it).
    launch_bound: the device idles most of each step (span >> union).
    scale: multiplies every device time, to build a "variant" run for compare tests.
    plateau: the sweep levels off (a knee at 4); else throughput doubles at every level.
    kind: the trace's kind (`decode`, `prefill`, `training`): non-decode steps carry no decode labels.
    stall: the device's idle is one long gap instead of many short ones (with launch_bound).
    ranks_missing: only 2 of the 8 ranks' traces matched (no cross-rank claim may be made).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "figures").mkdir(exist_ok=True)
    _write_run(run_dir, stages, schema.SCHEMA_VERSION if contract_keys else 1)
    writers = {"00_deploy": lambda: _write_deploy(run_dir),
               "01_macro_sweep": lambda: _write_sweep(run_dir, scale, plateau),
               "02_gemm_micro": lambda: _write_gemm(run_dir, scale),
               "03_nccl_burst": lambda: _write_collectives(run_dir, scale),
               "04_profiler_capture": lambda: _write_capture(run_dir, scale),
               "05_categorize": lambda: _write_categorize(
                   run_dir / "05_categorize", comm_exposed=comm_exposed, launch_bound=launch_bound, s=scale,
                   kind=kind, stall=stall, ranks_missing=ranks_missing, contract_keys=contract_keys)}
    for stage in ALL_STAGES:
        if stage in stages:
            writers[stage]()
    return run_dir


def set_level_columns(run_dir: str | Path, **columns: list) -> Path:
    """Overwrite columns of a run's `01_macro_sweep/levels.csv`, one value per level (a stalled
    or bunched level, as a test needs it); returns the run folder."""
    levels = Path(run_dir) / "01_macro_sweep" / "levels.csv"
    lv = pd.read_csv(levels)
    for name, values in columns.items():
        lv[name] = values
    lv.to_csv(levels, index=False)
    return Path(run_dir)


def _write_run(run_dir: Path, stages: tuple[str, ...], schema_version: int) -> None:
    """run.json (as `schema_version` wrote it) and params.yaml."""
    params = {
        "run": {"name": "synthetic"},
        "model": {"served_name": "synthetic-moe", "quantization": "W4A16 g32 (synthetic)"},
        "server": {"tp": 8, "engine": "vllm", "api_key_env": "MY_KEY"},
        "writeup": {"acceptance_lengths": [1.5, 2.0, 3.0], "draft_cost_fractions": [0.1, 0.2]},
        "hardware": {"name": "8x synthetic GPU", "peak_mem_bw_gbps": 1800.0, "peak_tflops": 500.0},
    }
    (run_dir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = {s: {"status": "ok", "duration_s": 12.5, "error": None,
                  "notebook": f"notebooks/{s}.ipynb"} for s in ALL_STAGES if s in stages}
    schema.write(run_dir / "run.json", {
        "run_id": run_dir.name, "schema_version": schema_version, "created_at": "2026-11-29T10:00:00Z", "git_commit": "abc1234",
        "git_dirty": False, "packages": {"vllm": "0.13.0", "torch": "2.9.0"},
        "hardware": {"cpu": "Synthetic CPU 64 cores", "gpus": ["synthetic GPU 96 GB"] * 8},
        "params": params, "argv": ["stepscope", "run", "params/synthetic.yaml"],
        "stages": status,
    }, schema.RunRecord)


def _write_deploy(run_dir: Path) -> None:
    """00_deploy/server.json of a launched 8-GPU vLLM server."""
    d = run_dir / "00_deploy"
    schema.write(d / "server.json", {
        "mode": "launch", "engine": "vllm", "engine_version": "0.13.0",
        "base_url": "http://127.0.0.1:8000", "served_model": "synthetic-moe",
        "models_response": {}, "tp": 8, "log_path": "00_deploy/server.log",
        "argv": ["vllm", "serve", "/models/x", "--tensor-parallel-size", "8", "--api-key",
                 "***redacted***"], "profiler_dir": "/tmp/prof", "started_at": "2026-11-29T10:00:05Z"},
        schema.ServerRecord)


def _write_sweep(run_dir: Path, s: float, plateau: bool) -> None:
    """01_macro_sweep: four closed-loop levels, with a knee at 4 or none."""
    d = run_dir / "01_macro_sweep"
    d.mkdir(exist_ok=True)
    rows = []
    tputs = (80.0, 150.0, 280.0, 300.0) if plateau else (80.0, 160.0, 320.0, 640.0)
    for c, tok in zip((1, 2, 4, 8), tputs):
        tok = tok / s
        rows.append({"level": f"c{c:04d}", "mode": "concurrency", "concurrency": c, "request_rate": float("inf"),
                     "n_requests": 4 * c + 8, "n_completed": 4 * c + 8, "n_failed": 0,
                     "duration_s": 10.0, "request_throughput_rps": tok / 128,
                     "output_throughput_tok_s": tok, "total_throughput_tok_s": 2 * tok,
                     "ttft_ms_mean": 30.0 * c * s, "ttft_ms_median": 28.0 * c * s,
                     "ttft_ms_p90": 40.0 * c * s, "ttft_ms_p99": 45.0 * c * s,
                     "tpot_ms_mean": 12.1 * s * (1 + 0.1 * c), "tpot_ms_median": 12.1 * s * (1 + 0.1 * c),
                     "tpot_ms_p90": 13.0 * s * (1 + 0.1 * c), "tpot_ms_p99": 14.0 * s * (1 + 0.1 * c),
                     "itl_ms_median": 12.0 * s, "e2el_ms_median": 1600.0 * s,
                     "littles_concurrency": c * 0.97, "peak_output_tok_s_1s": tok * 1.2,
                     "client_cpu_pct": 95.0 if c == 8 else 20.0, "client_bound": c == 8})
    schema.write_table(pd.DataFrame(rows), d / "levels.csv", schema.LevelRow)
    schema.write(d / "summary.json", {
        "knee_concurrency": 4 if plateau else None, "plateau_output_tok_s": 300.0 / s if plateau else None,
        "knee_gain": 0.1, "c1_ttft_ms_median": 28.0 * s, "c1_tpot_ms_median": 13.31 * s,
        "died_at_level": None,
        "flags": [] if plateau else ["no knee: output tok/s still grows by >= 10% per doubling of concurrency "
                                     "beyond every level; the plateau was not reached, extend sweep.concurrency"]},
        schema.SweepSummary)


def _write_gemm(run_dir: Path, s: float) -> None:
    """02_gemm_micro: Marlin W4A16 timings of two expert GEMMs, one skipped backend."""
    d = run_dir / "02_gemm_micro"
    d.mkdir(exist_ok=True)
    rows = []
    for gemm, n, k in (("experts.gate_up", 512, 7168), ("experts.down", 7168, 256)):
        for m in (1, 2, 4, 8):
            t = 10.0 + m
            flops = 2 * m * n * k
            byt = n * k * 0.5625 + 2 * m * k + 2 * m * n
            rows.append({"model": "synthetic-moe", "gemm": gemm, "layer_kind": "moe", "m": m, "n": n,
                         "k": k, "dtype": "w4a16", "backend": "marlin", "mode": "cold",
                         "time_us_median": t, "time_us_p10": t * 0.95, "time_us_p90": t * 1.05,
                         "tflops": flops / t / 1e6, "gbps": byt / t / 1e3,
                         "pct_peak_bw": 100 * byt / t / 1e3 / 1800, "status": "ok", "reason": ""})
    rows.append({"model": "synthetic-moe", "gemm": "experts.down", "layer_kind": "moe", "m": 1,
                 "n": 7168, "k": 256, "dtype": "w4a16", "backend": "fused_moe", "mode": "cold",
                 "status": "skipped", "reason": "no CUDA on this machine"})
    schema.write_table(pd.DataFrame(rows), d / "gemm.csv", schema.GemmRow)
    schema.write(d / "prediction.json", {"model": "synthetic-moe", "tp": 8, "method": "sum of median times",
                                         "gemm_us_per_decode_step": {"1": 5200.0 * s, "2": 5400.0 * s,
                                                                     "4": 5800.0 * s, "8": 6600.0 * s}},
                 schema.GemmPrediction)


def _write_collectives(run_dir: Path, s: float) -> None:
    """03_nccl_burst: NCCL all-reduce sizes, an eager and a CUDA-graph burst."""
    d = run_dir / "03_nccl_burst"
    d.mkdir(exist_ok=True)
    rows = []
    for size in (256, 4096, 14336, 65536, 1048576):
        t = (20.0 + size / 5e3) * s
        rows.append({"source": "stepscope", "op": "all_reduce", "backend": "nccl", "world_size": 8,
                     "dtype": "bfloat16", "size_bytes": size, "count": size // 2, "mode": "eager",
                     "placement": "in-place", "time_us_rank_min": 0.9 * t, "time_us_rank_median": t,
                     "time_us_rank_max": 1.2 * t, "algbw_gbps": size / t / 1e3,
                     "busbw_gbps": size / t / 1e3 * 1.75, "n_iters": 50})
    schema.write_table(pd.DataFrame(rows), d / "collectives.csv", schema.CollectiveRow)
    burst = [{"k": 123, "batch_m": 1, "size_bytes": 14336, "total_us": 6810.0 * s, "per_op_us": 55.4 * s,
              "mode": "eager", "backend": "nccl", "world_size": 8, "status": "ok"},
             {"k": 123, "batch_m": 1, "size_bytes": 14336, "total_us": 4300.0 * s, "per_op_us": 35.0 * s,
              "mode": "cuda_graph", "backend": "nccl", "world_size": 8, "status": "ok"}]
    schema.write_table(pd.DataFrame(burst), d / "burst.csv", schema.BurstRow)
    schema.write(d / "prediction.json", {"comm_us_per_decode_step": 4300.0 * s, "k": 123,
                                         "per_op_us": 35.0 * s, "size_bytes": 14336, "mode": "cuda_graph",
                                         "backend": "nccl"}, schema.CommPrediction)


def _write_capture(run_dir: Path, s: float) -> None:
    """04_profiler_capture: eight rank traces and the capture's latency."""
    d = run_dir / "04_profiler_capture"
    schema.write(d / "manifest.json", {"engine": "vllm", "engine_version": "0.13.0",
                                     "profiler_settings": {"with_stack": False}, "partial": False,
                                     "files": [{"rank": r, "path": f"traces/rank{r}.pt.trace.json.gz",
                                                "bytes": 80_000_000, "sha256": "0" * 64,
                                                "kind": "trace"} for r in range(8)]},
                 schema.CaptureManifest)
    schema.write(d / "capture_latency.json", {"n_requests": 5, "output_len": 32, "ttft_ms_mean": 30.0 * s,
                                              "ttft_ms_median": 29.0 * s, "tpot_ms_mean": 12.1 * s,
                                              "tpot_ms_median": 12.1 * s}, schema.CaptureLatency)


def _write_categorize(d: Path, *, comm_exposed: bool, launch_bound: bool, s: float, kind: str = "decode",
                      stall: bool = False, ranks_missing: bool = False, contract_keys: bool = True) -> None:
    """Stage 05's artifacts (`stepscope.schema.categorize`)."""
    d.mkdir(parents=True, exist_ok=True)
    # (category, class, busy ms per step, calls per step, exposed ms per step)
    ar_exposed = 5.0 if comm_exposed else 0.5
    cats = [("all_reduce", "communication", 5.5, 123, ar_exposed),
            ("all_gather", "communication", 0.2, 1, 0.2),
            ("quant_gemm", "compute", 4.0, 244, 4.0), ("fused_moe", "compute", 1.0, 60, 1.0),
            ("attention", "compute", 1.2, 61, 1.2), ("norm", "compute", 0.4, 123, 0.4),
            ("elementwise", "compute", 0.3, 200, 0.3), ("other", "compute", 0.01, 3, 0.01)]
    cats = [(c, k, ms * s, n, e * s) for c, k, ms, n, e in cats]
    kernel_sum = sum(ms for _, _, ms, _, _ in cats) * 1.02
    union = sum(e for *_, e in cats)
    span = union * (3.0 if launch_bound else 1.05)
    n_dec = 155 if kind == "decode" else 0
    n_judged = n_dec or 165
    dec, xr = _write_decode_tables(d, cats, n_dec, union, span)
    # Stage 05's ceilings on its basis: the period where the summary has one (`_add_contract_keys`).
    step, basis = (span * PERIOD_OVER_SPAN, "period") if contract_keys else (span, None)
    amdahl = pd.DataFrame([{"rank": 0, "category": c, "class": k, "step_ms": step, "denominator": basis,
                            "exposed_ms": e, "speedup_ceiling": ceiling_x(step, e)} for c, k, _, _, e in cats]
                          ).sort_values("speedup_ceiling", ascending=False)
    schema.write_table(amdahl, d / "amdahl.csv", schema.AmdahlRow)
    summary = _summary(cats, dec, xr, amdahl, kind=kind, n_dec=n_dec, n_judged=n_judged, kernel_sum=kernel_sum,
                       union=union, span=span, tpot=12.1 * s)
    if contract_keys:
        _add_contract_keys(summary, kind=kind, n_judged=n_judged, n_dec=n_dec, union=union, span=span,
                           launch_bound=launch_bound, stall=stall, ranks_missing=ranks_missing, s=s)
    if contract_keys:
        schema.write(d / "summary.json", summary, schema.TraceSummary)
    else:  # as a stage 05 of schema version 1 wrote it, unchecked: schema.versions reads it
        from stepscope.runfolder import write_json

        write_json(d / "summary.json", summary)
    _write_timeline(d, s, launch_bound)
    schema.write_table(pd.DataFrame([{"rank": r, "category": c, "class": k, "count": n * 160, "sum_us": ms * 160e3,
                   "union_us": ms * 160e3, "exposed_us": e * 160e3} for r in range(8)
                  for c, k, ms, n, e in cats]), d / "rank_categories.csv", schema.RankCategoryRow)
    _write_steps(d, kind, kernel_sum, union, span)


def _stat(v: float) -> dict:
    return {"mean": v, "median": v, "p90": v * 1.1}


def _write_decode_tables(d: Path, cats: list, n_dec: int, union: float, span: float
                         ) -> tuple[pd.DataFrame, list[dict]]:
    """decode_categories.csv (8 ranks, 2 % apart) and cross_rank.csv; (the decode table, cross-rank rows)."""
    dec_rows = []
    for r in range(8):
        jitter = 1.0 + 0.02 * r
        for c, k, ms, n, e in cats:
            dec_rows.append({"rank": r, "category": c, "class": k, "n_steps": n_dec,
                             "union_ms_mean": ms * jitter, "union_ms_median": ms * jitter,
                             "union_ms_p90": ms * jitter * 1.1, "sum_ms_mean": ms * jitter * 1.02,
                             "exposed_ms_mean": e * jitter, "share_of_span": ms * jitter / span,
                             "exposed_share_of_busy": e / union, "calls_per_step": float(n),
                             "us_per_call": 1000 * ms * jitter * 1.02 / n})
    dec = pd.DataFrame(dec_rows)
    schema.write_table(dec, d / "decode_categories.csv", schema.DecodeCategoryRow)
    xr = []
    for (c, k), g in dec.groupby(["category", "class"], sort=False):
        lo, hi = g.loc[g["union_ms_mean"].idxmin()], g.loc[g["union_ms_mean"].idxmax()]
        comm = k == "communication"
        xr.append({"category": c, "class": k, "n_ranks": len(g), "ms_per_step_min": lo["union_ms_mean"],
                   "ms_per_step_median": g["union_ms_mean"].median(), "ms_per_step_max": hi["union_ms_mean"],
                   "min_rank": int(lo["rank"]), "max_rank": int(hi["rank"]),
                   "transfer_ms_est": lo["union_ms_mean"] if comm else None,
                   "wait_ms_median": g["union_ms_mean"].median() - lo["union_ms_mean"] if comm else None,
                   "wait_ms_max": hi["union_ms_mean"] - lo["union_ms_mean"] if comm else None, "note": ""})
    schema.write_table(pd.DataFrame(xr), d / "cross_rank.csv", schema.CrossRankRow)
    return dec, xr


def _summary(cats: list, dec: pd.DataFrame, xr: list[dict], amdahl: pd.DataFrame, *, kind: str, n_dec: int,
             n_judged: int, kernel_sum: float, union: float, span: float, tpot: float) -> dict:
    """summary.json without the keys `_add_contract_keys` adds (an older stage 05's)."""
    ranks = []
    for r in range(8):
        ranks.append({"rank": r, "file": f"rank{r}.pt.trace.json.gz", "mode": "gpu",
                      "n_device_events": 160_000, "kernel_sum_us": kernel_sum * 1000 * 160,
                      "busy_us": union * 1000 * 160, "idle_us": (span - union) * 1000 * 160,
                      "span_us": span * 1000 * 160,
                      "categories": {c: {"count": n * 160, "sum_us": ms * 1000 * 160,
                                         "union_us": ms * 1000 * 160, "exposed_us": e * 1000 * 160}
                                     for c, _, ms, n, e in cats},
                      "other_share": 0.0006,
                      "other_top_names": [{"name": "void foo_kernel<128>", "sum_us": 90.0, "count": 400},
                                          {"name": "bar", "sum_us": 5.0, "count": 3}],
                      "n_steps": 165, "n_decode_steps": n_dec, "unattributed_events": 0 if r else 12,
                      "step_kinds": {kind: n_judged} if kind != "decode" else {"prefill": 10, "decode": n_dec},
                      "step_source": "annotation:vllm", "class_totals_us": None,
                      "collectives_per_decode_step": {"all_reduce": 123.0, "all_gather": 1.0}})
    return {
        "ranks": ranks,
        "decode": {"rank": 0,
                   "steps": {"steps_used": "decode" if n_dec else "all steps (no decode labels in this trace)",
                             "n_steps": n_judged, "kernel_sum_ms": _stat(kernel_sum),
                             "union_ms": _stat(union), "span_ms": _stat(span),
                             "annotation_ms": _stat(span * 1.02), "tpot_capture_ms": tpot},
                   "categories": dec[dec["rank"] == 0].to_dict(orient="records"),
                   "amdahl": amdahl.to_dict(orient="records")},
        "collectives_check": {
            "observed": {"steps_used": "decode", "n_steps": n_dec,
                         "all_reduce": {"median": 123.0, "min": 123, "max": 123},
                         "all_gather": {"median": 1.0, "min": 1, "max": 1},
                         "other_collective": {"median": 0.0, "min": 0, "max": 0}},
            "expected": {"all_reduce": 123, "all_gather": 1}, "match": True,
            "explanation": ["observed counts match the architecture"], "rank": 0, "tp": 8},
        "cross_rank": xr,
        "text_table_check": [{"file": "/x/profiler_out_0.txt", "rank": 0, "rows": 50, "layout": "gpu",
                              "self_cuda_total_us": kernel_sum * 1000 * 160 * 0.995,
                              "trace_kernel_sum_us": kernel_sum * 1000 * 160, "rel_diff": 0.005}],
        "flags": [{"code": "kernel_sum_above_tpot", "severity": "info",
                   "message": "kernel sum per decode step exceeds the measured TPOT: kernels overlap"}]
        if kernel_sum > tpot else [],
    }


def _write_timeline(d: Path, s: float, launch_bound: bool) -> None:
    """One step's 40 kernels on one stream (wide gaps when launch-bound) and a copy on another."""
    tl = []
    t = 0.0
    for i in range(40):
        cat = ["quant_gemm", "attention", "all_reduce", "norm", "elementwise"][i % 5]
        dur = {"quant_gemm": 30.0, "attention": 20.0, "all_reduce": 45.0, "norm": 5.0,
               "elementwise": 4.0}[cat] * s
        tl.append({"rank": 0, "step_id": 7, "stream": 7, "category": cat, "class": "compute",
                   "start_us": t, "dur_us": dur, "name": f"{cat}_k"})
        t += dur + (30.0 if launch_bound else 2.0)
    tl.append({"rank": 0, "step_id": 7, "stream": 13, "category": "memcpy", "class": "memory",
               "start_us": 5.0, "dur_us": 3.0, "name": "Memcpy HtoD"})
    schema.write_table(pd.DataFrame(tl), d / "timeline_rank0_step.csv", schema.TimelineRow)


def _write_steps(d: Path, kind: str, kernel_sum: float, union: float, span: float) -> None:
    """steps.csv: 165 steps per rank (10 prefill, then decode, for a decode trace)."""
    steps = []
    for r in range(8):
        for i in range(165):
            lab = ("prefill" if i < 10 else "decode") if kind == "decode" else kind
            steps.append({"rank": r, "step_id": i, "name": f"step{i}", "source": "annotation:vllm",
                          "label": lab, "n_events": 1000, "kernel_sum_us": kernel_sum * 1000,
                          "busy_us": union * 1000, "span_us": span * 1000 * (1 + 0.01 * (i % 7)),
                          "idle_us": (span - union) * 1000, "annotation_dur_us": span * 1020,
                          "all_reduce_calls": 123, "all_gather_calls": 1, "other_collective_calls": 0})
    schema.write_table(pd.DataFrame(steps), d / "steps.csv", schema.StepRow)


PERIOD_OVER_SPAN = 1.04
"""The synthetic run's decode period over its span: the time between steps."""


def _add_contract_keys(summary: dict, *, kind: str, n_judged: int, n_dec: int, union: float, span: float,
                       launch_bound: bool, stall: bool, ranks_missing: bool, s: float) -> None:
    """The newer stage-05 keys (PROTOCOL's contract): trace_info, period, idle split, matching, roofline."""
    period = span * PERIOD_OVER_SPAN
    idle = period - union
    micro = idle * (0.1 if stall else 0.8 if launch_bound else 0.5)
    summary["trace_info"] = {
        "kind": kind, "engine": "vllm", "device_name": "synthetic GPU", "device_count": 8, "batch_size": 1.0,
        "world_size": 8, "tp": 8, "tp_source": "trace", "tp_disagreement": False, "n_steps": 165,
        "n_decode_steps": n_dec, "low_confidence": False, "graph_replay": False}
    dec = summary["decode"]
    dec["period_ms"] = {"mean": period, "median": period, "p90": period * 1.05, "n": n_judged - 1}
    dec["denominator"] = "period"
    dec["idle_micro_ms"], dec["idle_macro_ms"] = micro, idle - micro
    dec["largest_gap"] = {"dur_ms": (0.85 * idle if stall else 0.05 * idle), "step": 42,
                          "before": "Memcpy DtoH (Device -> Pageable)" if stall else "quant_gemm_k",
                          "after": "all_reduce_k", "host_call": "cudaMemcpyAsync" if stall else None}
    dec["launch_delay_us"] = {"median": 8.0, "p90": 20.0}
    ar = 5.5 * s
    summary["collectives_matched"] = {
        "world_size": 8, "ranks_present": list(range(2 if ranks_missing else 8)), "complete": not ranks_missing,
        "n_instances": 123 * n_judged, "transfer_ms_per_step": 0.6 * ar, "wait_ms_per_step": 0.4 * ar,
        "skew_us": {"p50": 9.0, "p90": 31.0}, "straggler_rank": 5, "clock_flag": None}
    rows = []
    for cat, gb, ms in (("quant_gemm", 3.6, 4.0 * s), ("fused_moe", 0.9, 1.0 * s)):
        gbps = gb / (ms / 1e3)
        tflops = 2 * 7168 * 512 * 244 / (ms / 1e3) / 1e12
        rows.append({"category": cat, "calls_per_step": 244.0, "flops_per_step": 2 * 7168 * 512 * 244,
                     "bytes_per_step": gb * 1e9, "time_ms_per_step": ms, "achieved_tflops": tflops,
                     "achieved_gbps": gbps, "pct_peak_bw": 100 * gbps / 1800.0,
                     "pct_peak_flops": 100 * tflops / 500.0, "source": "architecture"})
    summary["roofline"] = {"device": {"name": "synthetic GPU", "peak_mem_bw_gbps": 1800.0, "peak_tflops": 500.0,
                                      "known": True}, "rows": rows}
