"""Stage 06: write report.md and a self-contained report.html from a run folder alone."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Sequence

import msgspec
import pandas as pd

from stepscope.report.load import load_appendix, micro_curve, section_load
from stepscope.trace.load_plots import LOAD_FIGURE, plot_load_anatomy
from stepscope.config import WriteupParams
from stepscope.report import analysis as an
from stepscope import schema
from stepscope.redaction import scrub
from stepscope.report import guards, prose
from stepscope.report import verdict as vd
from stepscope.report import whatif as wi
from stepscope.report.appendix import appendix_link, appendix_table, write_appendix
from stepscope.report.kinds import judged_kind, kind_table, kinds_appendix, kinds_section
from stepscope.report.opening import opening, trace_only
from stepscope.schema.writeup import APPENDIX_HTML, APPENDIX_MD, REPORT_HTML, REPORT_MD
from stepscope.micro.collectives import plot_latency_vs_size
from stepscope.micro.gemm import plot_roofline
from stepscope.report import figures as fg
from stepscope.report.artifacts import RunArtifacts, collective_counts, load_run_artifacts, num, words
from stepscope.report.markdown_util import (code_name, code_names, image, kv_table, markdown_to_html, md_table,
                                            measured_only, compact_table, constant_caption, missing_box,
                                            number_sections)
from stepscope.runfolder import save_figures
from stepscope.thresholds import BUNCHED_FLAG_SHARE, BUNCHED_GAP_MS, READINGS_AGREE_REL, STALL_GAP_S
from stepscope.sweep.plots import plot_latency_vs_concurrency, plot_throughput_vs_concurrency
from stepscope.trace import plots as cat
from stepscope.wording import (WINDOW, Md, fmt_num, fmt_pct, in_steps, md_code, md_text,
                               figure_text, per_step, per_step_header, plural, short_name,
                               work_unit)

STAGE_ID = "06_writeup"
FIGURE_LINK_PREFIX = "../figures/"
"""report.md lives in 06_writeup/; figures in the run folder's figures/."""


def writeup_params_from(a: RunArtifacts, override: WriteupParams | None = None) -> WriteupParams:
    """The run's writeup params from its snapshot; defaults for keys it lacks."""
    if override is not None:
        return override
    raw = (a.params or {}).get("writeup") or {}
    kwargs: dict[str, Any] = {}
    for f in msgspec.structs.fields(WriteupParams):
        if isinstance(raw, dict) and raw.get(f.name) is not None:
            v = raw[f.name]
            kwargs[f.name] = tuple(float(x) for x in v) if isinstance(v, list) else v
    try:
        return WriteupParams(**kwargs)
    except TypeError:
        return WriteupParams()


# --------------------------------------------------------------------------- figures


def _bars_frame(a: RunArtifacts, decode: pd.DataFrame) -> pd.DataFrame:
    """One bar per rank when stage 05 wrote every rank's decode table, else the reference rank."""
    d = a.decode_categories_all if a.decode_categories_all is not None else decode
    if "rank" in d and d["rank"].nunique() > 1:
        labels = "rank " + d["rank"].astype(str)
    else:
        labels = pd.Series(["decode step (mean)"] * len(d), index=d.index)
    ms = d["union_ms_mean"] if "union_ms_mean" in d else d["ms_per_step_mean"]  # stage rows, or the table
    return pd.DataFrame({"label": labels, "category": _figure_names(d["category"]), "ms_per_step": ms.astype(float)})


def _figure_names(names: pd.Series) -> pd.Series:
    """Category names as figure text (`wording.figure_text`): a `$` in a params rule's category
    would start mathtext, and a bad one fails the figure."""
    return names.map(figure_text)


def _same_as_stage_step_figure(ctx: ReportContext, bars: pd.DataFrame) -> bool:
    """One rank's one bar is stage 05's figure again, unless a capture TPOT marker (the report's own) is drawn."""
    return (ctx.totals.get("n_decode_steps") == 1 and bars["label"].nunique() == 1
            and ctx.totals.get("tpot_capture_ms") is None and bool(ctx.folder.figures("05_step_categories_rank")))


def make_figures(a: RunArtifacts, ctx: ReportContext) -> dict[str, str]:
    """Draw the report's figures into figures/ with their stage's plotting function, reusing a plot
    the stage saved; return {key: file name}."""
    made: dict[str, str] = {}
    drawn: dict[str, Any] = {}  # saved together at the end: two render at once where two cores are free

    def save(key: str, name: str, fig) -> None:
        drawn[name] = fig
        made[key] = name

    decode, totals = ctx.decode, ctx.totals
    n = totals.get("n_decode_steps")
    label = ctx.ident.step_label
    stage_figures = ctx.folder.figures
    if decode is not None:
        markers = {"busy (union)": totals.get("union_ms"), "span": totals.get("span_ms"),
                   "capture TPOT": totals.get("tpot_capture_ms")}
        bars = _bars_frame(a, decode)
        if not _same_as_stage_step_figure(ctx, bars):
            save("stacked", "step_category_ms_stacked.png",
                 cat.plot_decode_category_time_stacked(bars, markers, n, label))
        if "share_of_step" in decode:
            save("shares", "step_category_shares.png",
                 cat.plot_category_shares(decode.assign(category=_figure_names(decode["category"])), n, label))
    if a.timeline is not None and {"stream", "category", "start_us", "dur_us"} <= set(a.timeline.columns) \
            and not stage_figures("05_step_timeline"):
        lane = "thread" if totals.get("mode") == "cpu" else "stream"
        save("timeline", "step_timeline_rank0_by_lane.png",
             cat.plot_decode_step_timeline(a.timeline, lane=lane, step_label=label))
    if ctx.amdahl is not None:
        am = ctx.amdahl
        save("amdahl", "step_amdahl_ceiling_by_category.png",
             cat.plot_amdahl_ceiling(am.assign(category=_figure_names(am["category"])), label))
    if ctx.whatif is not None:
        save("whatif", "whatif_speculative_decoding_tpot.png",
             fg.plot_speculative_whatif(ctx.whatif.curves, ctx.whatif.baseline.step_ms))
    lv = a.levels
    sweep_cols = {"mode", "concurrency", "n_completed", "output_throughput_tok_s", "peak_output_tok_s_1s",
                  "client_bound", "ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99"}
    if lv is not None and sweep_cols <= set(lv.columns) and not stage_figures("sweep_") \
            and ((lv["mode"] == "concurrency") & (lv["n_completed"] > 0)).any():
        save("sweep_tput", "writeup_throughput_vs_concurrency.png", plot_throughput_vs_concurrency(lv, ctx.macro))
        save("sweep_lat", "writeup_latency_vs_concurrency.png", plot_latency_vs_concurrency(lv))
    if a.gemm is not None and not stage_figures("gemm_roofline") \
            and {"tflops", "gbps", "backend", "dtype"} <= set(a.gemm.columns):
        hw = (a.params or {}).get("hardware") or {}
        save("roofline", "writeup_gemm_roofline.png",
             plot_roofline(a.gemm, peak_bw_gbps=num(hw.get("peak_mem_bw_gbps")), peak_tflops=num(hw.get("peak_tflops"))))
    if a.collectives is not None and not stage_figures("collective_"):
        save("coll", "writeup_collective_latency_vs_size.png", plot_latency_vs_size(a.collectives, a.burst))
    load = a.load_anatomy
    if load is not None and (load["step_kind"] == "decode").any():  # no stage draws it: a drawing there is a past report's
        save("load", LOAD_FIGURE, plot_load_anatomy(load))
    save_figures(drawn, a.run_dir)
    return made


def _section_load(a: RunArtifacts, ctx: ReportContext) -> list[str]:
    """The step under load (report.load), when stage 04 captured load levels; else nothing."""
    fig = _img(ctx.figs["load"], "ms per decode step by category against batch size") if "load" in ctx.figs else None
    text = section_load(a, fig, ctx.verdict.load_growth, ctx.micro)
    return [text] if text else []


# --------------------------------------------------------------------------- sections


def _img(name: str, alt: str) -> str:
    return image(FIGURE_LINK_PREFIX + name, alt)


def quantization_cell(params_quantization: str | None, named: Sequence[dict]) -> Md:
    """The setup table's weight format: what params say and what the GEMM kernels' names
    state, both when both exist; "none" in params is a default, not evidence of bf16."""
    stated = (md_text(params_quantization) if params_quantization and str(params_quantization).lower() != "none"
              else None)
    seen = "; ".join(f"{md_text(r['format'])} named by {fmt_num(r['n_kernels'])} GEMM "
                     f"{plural('kernel', r['n_kernels'])} ({fmt_num(r['ms_per_step'])} ms per step, "
                     f"e.g. {code_name(r['example_kernel'], 60)})" for r in named)
    if stated and seen:
        return Md(f"{stated} (params); the trace: {seen}")
    if seen:
        return Md(f"{seen}; params do not say (`model.quantization`: {md_text(params_quantization or 'unset')})")
    if stated:
        return Md(f"{stated} (params; no GEMM kernel's name states a format)")
    return Md("not stated: params do not say and no GEMM kernel's name states a format")


def _device_line(ident: vd.TraceIdentity) -> Md | None:
    """The devices the run used (world size, else TP), not the node's `deviceProperties` list."""
    if not ident.device_name:
        return None
    n, src = ((ident.world_size, "world size") if ident.world_size else
              (ident.tp, f"TP from the {ident.tp_source}") if ident.tp and ident.tp_source != "default" else
              (None, None))
    node = (f"; its device list shows {fmt_num(ident.device_count)}" if ident.device_count and ident.device_count != n
            else "")
    name = md_text(ident.device_name)
    if n is None:
        return Md(f"{name} (from the trace; how many the run used is not said{node})")
    return Md(f"{fmt_num(n)} × {name} (from the trace, {src}{node})")


def _section_setup(a: RunArtifacts, ctx: ReportContext) -> str:
    run, server, params, ident = a.run, a.server, a.params or {}, ctx.ident
    hw_p = params.get("hardware") or {}
    hw_r = run.hardware if run is not None else schema.HostHardware()
    gpus = hw_r.gpus  # nvidia-smi's line per GPU (schema.versions upgrades older records)
    gpu_txt = f"{len(gpus)} × {', '.join(sorted(set(map(str, gpus))))}" if gpus else None
    model = params.get("model") or {}
    # The engine the trace shows, else the one the run served; never params' default.
    engine = ident.engine or (server.engine if server else None) or (a.manifest.engine if a.manifest else None)
    version = None
    if engine and server is not None:
        version = (server.engine_version or (a.manifest.engine_version if a.manifest else None)
                   or (run.packages.get(str(engine)) if run else None))
    device = _device_line(ident)
    tp = None
    if ident.tp:
        tp = (f"{fmt_num(ident.tp)} (a default: neither the params nor the trace give it)"
              if ident.tp_source == "default" else f"{fmt_num(ident.tp)} (from the {md_text(ident.tp_source)})")
        if ident.tp_disagreement:
            tp = Md(tp + " — **the trace's world size and the params disagree**")
    batch = None
    if ident.batch_size is not None:
        batch = (f"{fmt_num(ident.batch_size)} {plural('sequence', ident.batch_size)} per pass (from the input shapes)"
                 if ident.batch_source == "input shapes" else
                 f"{fmt_num(ident.batch_size)} {plural('request', ident.batch_size)} per step (median, from the step annotations)")
    # The machine that ran stepscope is the trace's only when this run captured the trace itself.
    captured_here = "04_profiler_capture" in ctx.folder.stages_present
    pairs = [
        ("Run", md_code(run.run_id if run else a.run_dir.name)),
        ("Date", (run.created_at if run else None) or (server.started_at if server else None)),
        ("Trace", f"{ident.kind} (no step marker: read whole, as one window)" if ident.step_label == WINDOW else
         f"{ident.kind} ({ident.step_label}s: {fmt_num(ident.n_judged_steps)})"
         if ident.n_judged_steps is not None else ident.kind),
        ("Device", device),
        ("Hardware", hw_p.get("name")),
        ("CPU" if captured_here else "Analysed on (CPU)", hw_r.cpu),
        ("Accelerators" if captured_here else "Analysed on (accelerators)", gpu_txt),
        ("Interconnect", hw_p.get("interconnect")),
        ("Engine", f"{engine} {version or ''}".strip() if engine else "unknown (neither the trace nor the run says)"),
        ("Server", Md(f"{md_text(server.mode)} mode at {md_code(server.base_url)}") if server else None),
        ("Model", (server.served_model if server else None) or model.get("served_name") or model.get("path")),
        ("Quantization", quantization_cell(model.get("quantization"), ident.weight_formats_named)),
        ("Batch", batch),
        ("Tensor parallel (TP)", tp),
        ("Code", Md(md_code(run.git_commit or "?") + (" (uncommitted changes)" if run.git_dirty else ""))
         if run else None),
    ]
    pairs = [(k, v) for k, v in pairs if v not in (None, "", "? ")]
    text = "## Setup\n\n" + kv_table(pairs, ("", "value"))
    sw = params.get("sweep") or {}
    cap = params.get("capture") or {}
    bits = []
    if sw and "01_macro_sweep" in ctx.folder.stages_present:
        bits.append(f"sweep concurrency {md_text(sw.get('concurrency', '?'))}, input "
                    f"{md_text(sw.get('input_len', '?'))} / output {md_text(sw.get('output_len', '?'))} tokens")
    if cap and captured_here:
        bits.append(f"profiler capture: {md_text(cap.get('requests', '?'))} requests × "
                    f"{md_text(cap.get('output_len', '?'))} output tokens at batch 1")
    if bits:
        text += "\nKey parameters: " + "; ".join(bits) + f". The full params file is in the [appendix]({APPENDIX_MD}).\n"
    if a.run is None and a.server is None:
        text += "\n" + missing_box("Provenance (hardware, engine version, date)", ["run.json", "00_deploy/server.json"])
    return text


def _goodput_columns(lv) -> list[tuple[str, str]]:
    """Goodput beside throughput, and the share within the SLO, where the sweep set one."""
    if "goodput_tok_s" not in lv or not lv["goodput_tok_s"].notna().any():
        return []
    return [("goodput_tok_s", "goodput tok/s"), ("goodput_rps", "goodput req/s"), ("slo_met_pct", "within SLO %")]


def _workload_columns(lv) -> list[tuple[str, str]]:
    """Prompt and output length spreads where lengths vary (file workloads), and the prefix
    cache's hit rate where the server served any prompt from it."""
    cols = []
    for kind in ("input", "output"):
        p50, p90 = f"{kind}_tokens_p50", f"{kind}_tokens_p90"
        if p90 in lv and (lv[p90].astype(float) > lv[p50].astype(float)).any():
            cols += [(p50, f"{kind} tok p50"), (p90, f"{kind} tok p90")]
    if "prefix_cache_hit_rate" in lv and (lv["prefix_cache_hit_rate"].astype(float) > 0).any():
        cols.append(("prefix_hit_pct", "prefix cache hit %"))
    return cols


def _slo_search_clause(search, mode: str) -> str:
    """What the SLO search (summary.json `slo_search`, SloSearchSummary) did along `mode`, as a
    clause of the SLO paragraph; '' where it did not run there."""
    m = getattr(search, mode, None) if search is not None else None
    if m is None:
        return ""

    def load(x):
        return "none" if x is None else (f"C={int(x)}" if mode == "concurrency" else f"{x:g} req/s")
    if not m.levels:
        return (f" (the SLO search added no level between {load(m.planned_boundary_load)} and "
                f"{load(m.planned_first_miss_load)}: {m.stopped})")
    return (f" (the SLO search narrowed it from {load(m.planned_boundary_load)}–{load(m.planned_first_miss_load)} "
            f"to {load(m.boundary_load)}–{load(m.first_miss_load)} with {len(m.levels)} extra {plural('level', len(m.levels))}, "
            f"{', '.join(m.levels)}, then stopped: {m.stopped})")


def _slo_paragraph(slo, search=None) -> str:
    """The SLO and its boundary level in words, from summary.json's `slo` (SloSummary), with
    what the SLO search did (`slo_search`, SloSearchSummary) where it ran."""
    if slo is None:
        return ""
    bounds = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.bounds_ms.items())
    text = (f"Under the SLO ({bounds} per request; goodput counts the requests that met every bound, as "
            f"`vllm bench serve --goodput` does) ")
    said = []
    for mode, b, key in (("concurrency", slo.concurrency, "concurrency"), ("request rate", slo.rate, "rate")):
        if b is None:
            continue
        unit = "" if mode == "concurrency" else " req/s"
        load = (lambda x: fmt_num(int(x))) if mode == "concurrency" else (lambda x: f"{x:g}")
        if b.boundary_level is None:
            said.append(f"no {mode} level had {100 * slo.min_share:g} % of its requests within it, not even "
                        f"the lowest ({b.first_miss_level})")
            continue
        where = ("the highest level measured, so the boundary lies above it" if b.first_miss_level is None
                 else f"the next level, {b.first_miss_level} ({mode} {load(b.first_miss_load)}{unit}), missed it")
        said.append(f"the SLO-boundary level is **{b.boundary_level}** ({mode} {load(b.boundary_load)}{unit}): "
                    f"at least {100 * slo.min_share:g} % of its requests met the SLO, with "
                    f"**{fmt_num(b.goodput_tok_s)} goodput tok/s** of {fmt_num(b.output_tok_s)} output tok/s; {where}"
                    + _slo_search_clause(search, key))
    return text + "; ".join(said) + ".\n\n" if said else ""


LEVEL_PCT = {"bunched_chunk_share": "bunched_pct", "stall_share": "stall_pct", "slo_met_share": "slo_met_pct",
             "prefix_cache_hit_rate": "prefix_hit_pct"}
"""The sweep levels' shares the tables show as %: bunched chunks and stalls (whether a level's numbers
measure the server's decode at all), requests within the SLO, prompts served from the prefix cache."""


def sweep_levels(levels: pd.DataFrame | None) -> pd.DataFrame | None:
    """The sweep's levels in table order (mode, then load), each share in `LEVEL_PCT` beside it as a %."""
    if levels is None:
        return None
    sort_cols = [c for c in ("mode", "concurrency", "request_rate") if c in levels]
    lv = levels.sort_values(sort_cols) if sort_cols else levels.copy()
    return lv.assign(**{pct: 100 * lv[share].astype(float) for share, pct in LEVEL_PCT.items() if share in lv})


def _section_macro(a: RunArtifacts, ctx: ReportContext) -> str:
    text = "## Macro results: throughput and latency under load\n\n"
    if ctx.levels is None:
        return text + missing_box("The load sweep", ["01_macro_sweep/levels.csv"], _why(a, "01_macro_sweep"))
    h = ctx.macro
    plateau = ctx.verdict.plateau
    parts = []
    if plateau is not None:  # the verdict's own sentence (prose.plateau_sentence), not a second wording
        text += prose.plateau_sentence(plateau)
        if plateau.reached and plateau.knee_gain_pct is not None:
            text += (f" The knee is the level beyond which doubling concurrency adds less than "
                     f"{fmt_num(plateau.knee_gain_pct)} % output tok/s.")
        text += "\n\n"
    if h.get("c1_tpot_ms_median") is not None:
        parts.append(f"at concurrency 1 the median TPOT is **{fmt_num(h['c1_tpot_ms_median'])} ms** and the "
                     f"median TTFT **{fmt_num(h['c1_ttft_ms_median'])} ms**")
        bunched = h.get("c1_bunched_share")
        if bunched is not None and bunched > BUNCHED_FLAG_SHARE:
            parts[-1] += (f", but {fmt_pct(bunched)} of that level's token chunks arrived together with "
                          f"the previous one, so its TPOT measures delivery, not decode (the step period in "
                          f"the profiler breakdown is the engine's own clock)")
    if parts:
        text += "In this sweep " + "; ".join(parts) + ".\n\n"
    text += (_slo_paragraph(a.sweep_summary.slo, a.sweep_summary.slo_search) if a.sweep_summary is not None
             else "")
    lv = ctx.levels.copy()
    if {"n_completed", "n_failed"} <= set(lv.columns):
        lv["done_failed"] = lv["n_completed"].map(fmt_num) + " / " + lv["n_failed"].map(fmt_num)
    keys = [("mode", "mode"), ("concurrency", "concurrency"), ("request_rate", "rate (req/s)")]
    lv, keys = measured_only(lv, keys, keys=[])
    keys, same = constant_caption(lv, keys, keep=("concurrency",))
    text += (f"Per level ({len(lv)} levels{', ' + same if same else ''}; per-request statistics as "
             f"`vllm bench serve` defines them: TPOT = (E2EL − TTFT)/(output tokens − 1)), in three tables:\n\n")
    for title, cols in (("Throughput (tok/s)", [("done_failed", "done / failed"),
                                                ("output_throughput_tok_s", "output tok/s"),
                                                ("total_throughput_tok_s", "total tok/s"), *_goodput_columns(lv),
                                                ("peak_output_tok_s_1s", "peak 1 s tok/s"),
                                                ("littles_concurrency", "Little's L")]),
                        ("Latency (ms)", [("ttft_ms_median", "TTFT p50"), ("ttft_ms_p99", "TTFT p99"),
                                          ("tpot_ms_median", "TPOT p50"), ("tpot_ms_p99", "TPOT p99"),
                                          ("itl_ms_median", "ITL p50"), ("e2el_ms_median", "E2EL p50")]),
                        ("Whether a level measured the server", [*_workload_columns(lv),
                                                                 ("client_cpu_pct", "client CPU %"),
                                                                 ("client_bound", "client-bound?"),
                                                                 ("bunched_pct", "chunks bunched %"),
                                                                 ("stall_pct", "stalled % of level")])):
        text += _level_table(lv, title, keys, cols)
    if "bunched_pct" in lv or "stall_pct" in lv:
        text += (f"\n*chunks bunched %*: token chunks that arrived with the previous one (gap under "
                 f"{fmt_num(BUNCHED_GAP_MS)} ms); above "
                 f"{fmt_pct(BUNCHED_FLAG_SHARE)} a level's TPOT and ITL measure delivery, not decode. "
                 f"*stalled % of level*: time every open stream was silent at once for over "
                 f"{fmt_num(STALL_GAP_S)} s; the level's throughput is low by up to that share.\n")
    for name in ctx.folder.figures("sweep_"):
        text += "\n" + _img(name, name.removesuffix(".png").replace("_", " "))
    for key in ("sweep_tput", "sweep_lat"):
        if key in ctx.figs:
            text += "\n" + _img(ctx.figs[key], key)
    return text


def _level_table(lv: pd.DataFrame, title: str, keys: list[tuple[str, str]], cols: list[tuple[str, str]]) -> str:
    """One of the sweep's tables: the level's keys and a few columns, narrow enough to read whole;
    a column with one value in every row is said once in the caption instead."""
    lv, shown = measured_only(lv, keys + cols, keys=[c for c, _ in keys])
    shown, same = constant_caption(lv, shown, keep=("concurrency",))
    if not [c for c in shown if c not in keys]:
        return ""
    return f"*{title}*" + (f" (every level: {same})" if same else "") + ":\n\n" + md_table(lv, shown) + "\n"


def _prediction_rows(ok: pd.DataFrame, pred: schema.GemmPrediction | None) -> pd.DataFrame:
    """The timed points stage 02's prediction reads: its model's, at its backend, dtype and mode
    (the routed experts' own backend too); every point when there is no prediction."""
    if pred is None:
        return ok
    rows = ok[ok["model"].astype(str) == pred.model] if "model" in ok and pred.model else ok
    cfg = pred.config
    keep = pd.Series(True, index=rows.index)
    for col, want in (("backend", cfg.backend), ("dtype", cfg.dtype), ("mode", cfg.mode)):
        if want is not None and col in rows:
            keep &= rows[col].astype(str) == want
    if cfg.routed_backend and {"backend", "dtype"} <= set(rows.columns):
        keep |= (rows["backend"].astype(str) == cfg.routed_backend[0]) & (rows["dtype"].astype(str) == cfg.routed_backend[-1])
    return rows[keep] if keep.any() else rows


def _gemm_tables(ok: pd.DataFrame) -> str:
    """Stage 02's timed points pivoted to one row per shape and a column per M, one table per
    model, each with only the M it timed (a reference model timed at M=1 shows no empty columns)."""
    keys = [c for c in ("model", "gemm", "n", "k", "dtype", "backend", "mode") if c in ok]
    piv = ok.pivot_table(index=keys, columns="m", values="time_us_median", aggfunc="median")
    piv.columns = [f"M={int(c)}" for c in piv.columns]
    piv = piv.reset_index()
    text = ""
    for model, part in (piv.groupby("model", sort=True) if "model" in piv else [(None, piv)]):
        table, cols = measured_only(part, [(c, c) for c in piv.columns if c != "model"], keys=keys)
        cols, same = constant_caption(table, cols)
        text += f"*{md_text(model)}*" + (f" ({same})" if same else "") + ":\n\n" if model is not None else ""
        text += md_table(table, cols) + "\n"
    return text


def _collective_table(c: pd.DataFrame) -> str:
    c = c.assign(range=c["time_us_rank_min"].map(fmt_num) + "–" + c["time_us_rank_max"].map(fmt_num))
    return ("Per-op time in µs (median, min–max across ranks), algbw = bytes/time, busbw with the nccl-tests "
            "factor (all-reduce 2(n−1)/n):\n\n"
            + compact_table(c, [("op", "op"), ("backend", "backend"), ("world_size", "ranks"), ("mode", "mode"),
                                ("size_bytes", "bytes"), ("time_us_rank_median", "µs median"),
                                ("range", "µs min–max"), ("algbw_gbps", "algbw GB/s"), ("busbw_gbps", "busbw GB/s")],
                            keys=("op", "backend", "size_bytes"), settings=("world_size",)))


GEMM_USED_HEADING = "GEMM timings the prediction reads (stage 02)"
GEMM_ALL_HEADING = "GEMM timings, every point (stage 02)"


def appendix_tables(a: RunArtifacts, ctx: ReportContext) -> str:
    """The measurements the report shows as figures or summaries, in full, and the tables it links
    rather than shows (each under the `### ` heading its `appendix_link` names), for the appendix."""
    w = ctx.whatif
    parts = []
    if a.gemm is not None and "status" in a.gemm and (a.gemm["status"].astype(str) == "ok").any():
        ok = a.gemm[a.gemm["status"].astype(str) == "ok"]
        parts.append(appendix_table(GEMM_USED_HEADING, "Median µs per call, one row per shape:\n\n"
                                    + _gemm_tables(_prediction_rows(ok, a.gemm_prediction))))
        parts.append(appendix_table(GEMM_ALL_HEADING, "Median µs per call:\n\n" + _gemm_tables(ok)))
    if a.collectives is not None and len(a.collectives):
        parts.append("### Collectives (stage 03)\n\n" + _collective_table(a.collectives))
    parts += _breakdown_appendix(a, ctx)
    parts.append(load_appendix(a, ctx.micro))
    if ctx.verdict.roofline:
        parts.append(_roofline_table(ctx.verdict))
    if w is not None:
        parts += _whatif_appendix(ctx, w)
    if ctx.cross_rank is not None:
        parts.append(appendix_table(CROSS_RANK_HEADING, _cross_rank_spread(ctx.cross_rank)))
    parts.append(_transfer_table(ctx.cross_rank))
    return "\n".join(p for p in parts if p)


def _whatif_appendix(ctx: ReportContext, w: WhatIfProjection) -> list[str]:
    """The what-if's tables the report links rather than shows."""
    parts = []
    if _whatif_table_in_appendix(ctx):
        method = whatif_method(w.verify_extra_tokens)
        parts.append(appendix_table(WHATIF_HEADING, method[0].upper() + method[1:] + "\n\n"
                                    + _whatif_table(w.predictions)))
    if _whatif_load_moved(w.load_rows):
        parts.append(appendix_table(WHATIF_LOAD_HEADING, WHATIF_LOAD_INTRO + _whatif_load_table(w.load_rows)))
    if w.predictions and not w.parts_assumed:
        parts.append(appendix_table(WHATIF_PARTS_HEADING, PARTS_INTRO + _parts_table(w.baseline, w.predictions)))
    return parts


def _breakdown_appendix(a: RunArtifacts, ctx: ReportContext) -> list[str]:
    """Section 4's tables that the report links rather than shows: the largest kernels, the step
    kinds side by side, the step read several ways."""
    decode, totals, ident = ctx.decode, ctx.totals, ctx.ident
    if decode is None:
        return []
    return [_category_kernels(a.category_kernels, decode, totals, ident.step_label),
            kinds_appendix(ctx.kinds, judged_kind(a), ident.step_label), _step_readings_table(totals, ident)]


def _burst_table(b: pd.DataFrame) -> str:
    """Stage 03's bursts: the timed ones in a table, the ones not timed in a line with the reason."""
    b = b.assign(total_over_k_us=b["total_us"] / b["k"])
    timed = b["status"].astype(str) == "ok" if "status" in b else pd.Series(True, index=b.index)
    text = compact_table(b[timed], [("k", "K"), ("batch_m", "batch M"), ("size_bytes", "bytes"), ("mode", "mode"),
                                    ("backend", "backend"), ("world_size", "ranks"), ("total_us", "total µs"),
                                    ("per_op_us", "per-op µs"), ("total_over_k_us", "total / K µs"),
                                    ("status", "status")], keys=("k", "mode", "backend"),
                         settings=("batch_m", "size_bytes", "world_size")) if timed.any() else ""
    skipped = b[~timed]
    if len(skipped):
        why = skipped.groupby([skipped["status"].astype(str), skipped["reason"].astype(str)], sort=False)
        text += "\nNot timed: " + "; ".join(
            f"{md_text(' and '.join(dict.fromkeys(f'{m} ({be})' for m, be in zip(g['mode'], g['backend']))))}, "
            f"{md_text(status)}: {md_text(reason)}" for (status, reason), g in why) + ".\n"
    return text


def _section_micro(a: RunArtifacts, ctx: ReportContext) -> str:
    figs = ctx.figs
    text = "## Micro-benchmarks at the model's shapes\n\n### GEMMs\n\n"
    g = a.gemm
    if g is None:
        text += missing_box("GEMM timings", ["02_gemm_micro/gemm.csv"], _why(a, "02_gemm_micro"))
    else:
        ok = g[g["status"].astype(str) == "ok"]
        bad = g[g["status"].astype(str) != "ok"]
        if len(ok):
            used = _prediction_rows(ok, a.gemm_prediction)
            text += (f"Stage 02 timed {len(ok)} points; the median time per call of the {len(used)} the prediction "
                     f"reads, one row per shape, is in the {appendix_link(GEMM_USED_HEADING)}, every point "
                     f"{appendix_link(GEMM_ALL_HEADING, 'beside it')} (spread p10–p90, TFLOP/s, GB/s and % of peak "
                     "bandwidth per point in `02_gemm_micro/gemm.csv`).\n")
            if "pct_peak_bw" in ok and ok["pct_peak_bw"].notna().any():
                best = ok.loc[ok["pct_peak_bw"].astype(float).idxmax()]
                text += (f"\nBest bandwidth use: {fmt_num(best['pct_peak_bw'])} % of peak "
                         f"({md_text(best.get('gemm'))}, M={fmt_num(best.get('m'))}, {md_text(best.get('backend'))} "
                         f"{md_text(best.get('dtype'))}).\n")
        if len(bad):
            keys = [c for c in ("backend", "status", "reason") if c in bad]
            reasons = bad.groupby(keys, dropna=False).size().reset_index(name="points")
            text += f"\nNot timed ({len(bad)} points): " + "; ".join(  # a line each: a table's rows were these lines
                ", ".join(md_text(r[k]) for k in keys if pd.notna(r[k])) + f" ({fmt_num(int(r['points']))} points)"
                for _, r in reasons.iterrows()) + ".\n"
        pred = a.gemm_prediction.gemm_us_per_decode_step if a.gemm_prediction else {}
        if pred:
            pts = ", ".join(f"M={m}: {fmt_num(v / 1000)} ms" for m, v in sorted(pred.items(), key=lambda kv: float(kv[0])))
            method = a.gemm_prediction.method or "sum over the model's GEMMs weighted by calls per step"
            text += f"\nPredicted GEMM time per decode step ({md_text(method)}): {pts}.\n"
            if hot := a.gemm_prediction.hot_gemm_us_per_decode_step:  # docs/methods.md#hot-and-cold-weights
                text += ("The same sum timed hot (one weight, re-read from cache): " + ", ".join(
                    f"M={m}: {fmt_num(v / 1000)} ms" for m, v in sorted(hot.items(), key=lambda kv: float(kv[0])))
                    + "; a decode step reads its weights from memory, as the cold rows do.\n")
        for name in ctx.folder.figures("gemm_roofline"):
            text += "\n" + _img(name, "GEMM roofline")
        if "roofline" in figs:
            text += "\n" + _img(figs["roofline"], "GEMM roofline")
    text += "\n### Collectives\n\n"
    c = a.collectives
    if c is None:
        text += missing_box("Collective timings", ["03_nccl_burst/collectives.csv"], _why(a, "03_nccl_burst"))
    else:
        text += (f"Per-op time against message size, {len(c)} points (median over ranks): the figure; the table, "
                 f"with the spread across ranks and bandwidths, is in the [appendix]({APPENDIX_MD}#measurements-in-full).\n")
        for name in ctx.folder.figures("collective_"):
            text += "\n" + _img(name, name.removesuffix(".png").replace("_", " "))
        if "coll" in figs:
            text += "\n" + _img(figs["coll"], "collective latency against size")
    b = a.burst
    if b is not None:
        text += ("\nBursts of K back-to-back all-reduces, the way a decode step issues them (count, total, per-op "
                 "time and mode always together):\n\n")
        text += _burst_table(b)
    elif c is not None:
        text += "\n" + missing_box("The burst measurement", ["03_nccl_burst/burst.csv"])
    cp = a.comm_prediction
    if cp is not None and cp.comm_us_per_decode_step is not None:
        text += (f"\nPredicted communication per decode step: {fmt_num(cp.k)} × {fmt_num(cp.per_op_us)} µs "
                 f"= **{fmt_num(cp.comm_us_per_decode_step / 1000)} ms** "
                 f"({fmt_num(cp.size_bytes)} bytes per op, {md_text(cp.backend or '?')}, {md_text(cp.mode or '?')} mode")
        if cp.k_source:
            text += f"; K from {md_text(cp.k_source)}"
        text += ").\n"
        if cp.eager_per_op_us_same_size is not None:
            text += (f"One all-reduce of the same size timed alone (eager) takes {fmt_num(cp.eager_per_op_us_same_size)} "
                     f"µs; in the burst each costs {fmt_num(cp.burst_over_eager_per_op)}× that.\n")
        if cp.notes:
            text += "".join(f"\n- {md_text(n)}" for n in cp.notes) + "\n"
    return text


def _section_breakdown(a: RunArtifacts, ctx: ReportContext) -> str:
    ident = ctx.ident
    text = f"## Profiler breakdown of a {ident.step_label}\n\n" + _capture_line(a)
    decode, totals = ctx.decode, ctx.totals
    if decode is None:
        return text + missing_box("The per-category breakdown", ["05_categorize/summary.json",
                                                                 "05_categorize/decode_categories.csv"],
                                  _why(a, "05_categorize"))
    text += _category_table(decode, totals, ident)
    text += _kernels_pointer(a.category_kernels, decode, totals, ident.step_label)
    text += kinds_section(ctx.kinds, ident.step_label)
    text += _step_readings(totals, ident)
    text += _breakdown_figures(a, ctx)
    return text + _across_ranks(a, ctx)


def _capture_line(a: RunArtifacts) -> str:
    man = a.manifest
    if man is None:
        return ""
    ranks = sorted({f.rank for f in man.files if f.rank is not None and f.kind == "trace"})
    total_mb = sum(f.bytes or 0 for f in man.files) / 1e6
    text = (f"Capture: {md_text(man.engine or '?')} {md_text(man.engine_version or '')}, {len(man.files)} files from "
            f"{len(ranks)} rank(s), {fmt_num(total_mb)} MB" + (", **partial**" if man.partial else "") + ".")
    cl = a.capture_latency
    if an.capture_tpot_is_delivery(a):
        text += (f" During capture the client measured {fmt_num(cl.n_requests)} requests × "
                 f"{fmt_num(cl.output_len)} tokens: TTFT mean {fmt_num(cl.ttft_ms_mean)} ms; their TPOT "
                 f"(mean {fmt_num(cl.tpot_ms_mean)} ms) measures delivery, not decode (why: *Read with care* at "
                 "the top), so the step period, the engine's own clock, stands in for it.")
    elif cl is not None:
        text += (f" During capture the client measured {fmt_num(cl.n_requests)} requests × "
                 f"{fmt_num(cl.output_len)} tokens: TPOT mean {fmt_num(cl.tpot_ms_mean)} ms, "
                 f"TTFT mean {fmt_num(cl.ttft_ms_mean)} ms.")
    return text + "\n\n"


def _rank_shown(totals: dict, ident: vd.TraceIdentity) -> str:
    """Which rank the per-step tables show: the reference rank stage 05 chose, said as it is
    (a trace of rank 3 alone is not "rank 0")."""
    r = totals.get("rank")
    if r is None:
        return "the reference rank unless stated"
    return f"rank {fmt_num(r)} unless stated" if (ident.ranks_present or 0) > 1 else f"rank {fmt_num(r)}, the only one here"


def _category_table(decode: pd.DataFrame, totals: dict, ident: vd.TraceIdentity) -> str:
    n, label = ident.n_judged_steps, ident.step_label
    ms = per_step_header("ms", label)
    over = prose.steps(n, label) if n or label == WINDOW else f"all {label}s"
    share_of = label if label == WINDOW else "step"  # "% of step", "% of window"
    text = (f"Per category, over {over} ({_rank_shown(totals, ident)}; ms {per_step(label)} from exact "
            f"{'' if label == WINDOW else 'per-step '}sums; % of {share_of} against the {totals.get('step_basis') or 'step'} of "
            f"{fmt_num(totals.get('step_ms'))} ms"
            + (f"; the period is not used: {totals['basis_reason']}" if totals.get("basis_reason") else "")
            + "):\n\n")
    d = decode.copy()
    if "share_of_step" in d:
        d["share_pct"] = 100 * d["share_of_step"].astype(float)
    text += (f"*{ms}* is the category's busy time (the union of its kernels, so its own overlaps count once); "
             "*summed* adds every kernel's duration; *exposed* is the part no higher-priority work covers "
             "(compute, then communication, then memory).\n\n")
    return text + compact_table(d, [("category", "category"), ("class", "class"), ("ms_per_step_mean", f"{ms} mean"),
                                    ("ms_per_step_median", f"{ms} median"), ("ms_per_step_p90", f"{ms} p90"),
                                    ("sum_ms_mean", f"summed {ms}"), ("exposed_ms_mean", f"exposed {ms}"),
                                    ("share_pct", f"% of {share_of}"),
                                    ("calls_per_step", per_step_header("calls", label)), ("us_per_call", "µs/call")],
                                keys=("category",))


KERNEL_CATEGORIES_SHOWN = 3
KERNELS_SHOWN = 3


def _category_kernels(kernels: pd.DataFrame | None, decode: pd.DataFrame, totals: dict, label: str = "step") -> str:
    """The largest kernels (ops on a CPU trace) of the largest categories, what a fix would touch,
    under `_kernels_heading` for the appendix; '' without stage 05's table."""
    if kernels is None or "category" not in decode:
        return ""
    what = work_unit(totals.get("mode") == "cpu")
    top = list(decode["category"].head(KERNEL_CATEGORIES_SHOWN))
    k = kernels[kernels["category"].isin(top)].copy()
    if k.empty:
        return ""
    k["order"] = k["category"].map({c: i for i, c in enumerate(top)})
    k = k.sort_values(["order", "sum_ms_per_step"], ascending=[True, False], kind="stable")
    k = k.groupby("category", sort=False).head(KERNELS_SHOWN)
    k["name"] = code_names(k["name"])
    k["share_pct"] = 100 * k["share_of_category"].astype(float)
    k["of"] = k["n_names"].map(lambda n: f"of {fmt_num(int(n))}")
    if "decided_by" in k:  # older tables lack it
        k["decided_by"] = k["decided_by"].map(lambda d: d if pd.isna(d) else short_name(str(d), 50))
    # the module path each ran in (traces with module frames): its last two parts name it
    mod = [("module", "module")] if "module" in k and k["module"].notna().any() else []
    if mod:
        share = k["module_share"] if "module_share" in k else pd.Series(1.0, index=k.index)
        k["module"] = [m if pd.isna(m) else "/".join(str(m).split("/")[-2:])
                       + (f" ({fmt_pct(float(x))})" if pd.notna(x) and float(x) < 0.995 else "")
                       for m, x in zip(k["module"], share)]
    over = "in the window" if label == WINDOW else "per step over the same steps"
    return appendix_table(_kernels_heading(totals), (
            f"The largest {what} of the {len(top)} largest categories (summed ms {over}; "
            f"% of the category's summed time; up to {fmt_num(KERNELS_SHOWN)} per category here, long names cut in "
            f"the middle; more, in full, in `05_categorize/category_kernels.csv`):\n\n"
            + md_table(k, [("category", "category"), ("name", what[:-1]), ("of", "names in category"),
                           ("sum_ms_per_step", f"summed {per_step_header('ms', label)}"), ("share_pct", "% of category"),
                           ("calls_per_step", per_step_header("calls", label)), ("us_per_call", "µs/call"),
                           ("decided_by", "placed by"), *mod], md_columns=("name",))))


def _kernels_heading(totals: dict) -> str:
    return f"Largest {work_unit(totals.get('mode') == 'cpu')} per category (stage 05)"


def _kernels_pointer(kernels: pd.DataFrame | None, decode: pd.DataFrame, totals: dict, label: str = "step") -> str:
    """The report's line linking the largest kernels' table in the appendix; '' without one."""
    if not _category_kernels(kernels, decode, totals, label):
        return ""
    n = min(KERNEL_CATEGORIES_SHOWN, len(decode))
    return (f"\nThe largest {work_unit(totals.get('mode') == 'cpu')} of the {n} largest categories, with their shares "
            f"and what placed them: {appendix_link(_kernels_heading(totals))}.\n")


STEP_READINGS_HEADING = "Step readings (stage 05)"


def _step_readings_table(totals: dict, ident: vd.TraceIdentity) -> str:
    """The step read several ways, for the appendix; only a decode trace has a TPOT row ("–" when unmeasured)."""
    label = ident.step_label
    window = label == WINDOW  # the whole trace: no step annotation, no next step
    cpu, dev = totals.get("mode") == "cpu", an.device_word(totals)
    rows = [("op sum (every op's self time added up)" if cpu else
             "device-time sum (every kernel's, memcpy's and memset's duration added up)",
             totals.get("kernel_sum_ms")),
            (f"union (time the {dev} was busy)", totals.get("union_ms")),
            (f"span (first to last {'op' if cpu else 'device event'} of the {'window' if window else 'step'})",
             totals.get("span_ms")),
            ("period (start of one step to the start of the next)", totals.get("period_ms")),
            ("step annotation (host-side duration of the engine step)", None if window else totals.get("annotation_ms")),
            ("TPOT measured by the client during capture", totals.get("tpot_capture_ms"))]
    return appendix_table(STEP_READINGS_HEADING, f"The same {'window' if window else 'step'} read several ways (ms "
                          f"{per_step(label)}):\n\n" + kv_table(
        [(k, v) for k, v in rows if v is not None or ("TPOT" in k and ident.has_decode)],
        ("reading (mean)", f"ms {per_step(label)}")))


def _step_readings(totals: dict, ident: vd.TraceIdentity) -> str:
    """The step's readings reconciled, one finding a bullet; the table of them is the appendix's."""
    rec = an.reconciliation(totals, ident.step_label)
    what = "window" if ident.step_label == WINDOW else "step"
    if not rec:
        return f"\nThe same {what} read several ways: {appendix_link(STEP_READINGS_HEADING)}.\n"
    return (f"\nThe same {what} read several ways ({appendix_link(STEP_READINGS_HEADING, 'table')}):\n\n"
            + "\n".join(f"- {s}" for s in rec) + "\n")


def _breakdown_figures(a: RunArtifacts, ctx: ReportContext) -> str:
    text, figs, step_label = "", ctx.figs, ctx.ident.step_label
    timeline_alt = f"timeline of one {step_label} on rank {fmt_num(a.decode.rank) if a.decode.rank is not None else 0}"
    for key, alt in (("stacked", f"category time per {step_label}"), ("shares", f"category shares of a {step_label}"),
                     ("timeline", timeline_alt)):
        if key in figs:
            text += "\n" + _img(figs[key], alt)
    # Stage 05's own plots that the report's figures do not repeat.
    stage_timeline = ctx.folder.figures("05_step_timeline")
    for name in stage_timeline:
        text += "\n" + _img(name, timeline_alt)
    if "timeline" not in figs and not stage_timeline and a.timeline is None:  # say missing only when it is
        text += "\n" + missing_box(f"The {step_label} timeline", ["05_categorize/timeline_rank0_step.csv"])
    text += _perfetto_pointer(a, ctx)
    for name in ctx.folder.figures("05_step_categories") + ctx.folder.figures("05_cross_rank"):
        text += "\n" + _img(name, name.removesuffix(".png").replace("_", " "))
    return text


def _perfetto_pointer(a: RunArtifacts, ctx: ReportContext) -> str:
    """A paragraph linking stage 05's merged Perfetto file and naming the drawn step; "" where the
    run has no such file or no drawn step."""
    from stepscope.trace.perfetto import MERGED_NAME, UI_URL

    t = a.timeline
    if not ctx.folder.perfetto_merged or t is None or "step_id" not in t or not len(t):
        return ""
    rank = int(t["rank"].iloc[0]) if "rank" in t else 0
    href = f"../05_categorize/perfetto/{MERGED_NAME}"
    return ("\n" + prose.perfetto_sentence(int(t["step_id"].iloc[0]), rank, ctx.ident.step_label, href, MERGED_NAME,
                                            UI_URL) + "\n")


def cross_rank_table(cr: pd.DataFrame | None, readings: pd.DataFrame | None,
                     split: vd.CommSplit | None) -> pd.DataFrame | None:
    """Stage 05's spread across ranks with the matched transfer beside it; None for one rank or a
    sample of ranks (it would describe the sample, not the job)."""
    if cr is None or not len(cr) or "category" not in cr or (split is not None and split.status == "ranks missing"):
        return None
    if "n_ranks" in cr and cr["n_ranks"].max() <= 1:
        return None
    return cr if readings is None else cr.merge(readings[["category", "transfer_ms_matched"]], on="category", how="left")


def _cross_rank_spread(table: pd.DataFrame) -> str:
    return compact_table(table, [("category", "category"), ("n_ranks", "ranks"), ("ms_per_step_min", "min"),
                                 ("ms_per_step_median", "median"), ("ms_per_step_max", "max"),
                                 ("min_rank", "min on rank"), ("max_rank", "max on rank")], keys=("category",),
                         settings=("n_ranks", "min_rank", "max_rank"))


def _across_ranks(a: RunArtifacts, ctx: ReportContext) -> str:
    """The collectives' transfer and wait across ranks, and the spread of every category (in the
    appendix when stage 05's figure shows it)."""
    split = ctx.verdict.comm_split
    if split is not None and split.status == "ranks missing" and a.cross_rank is not None and len(a.cross_rank):
        return (f"\nAcross ranks: only {fmt_num(split.ranks_present)} of {fmt_num(split.world_size)} ranks' traces "
                f"are here, so the spread across ranks and any transfer estimate would describe a sample, not "
                f"the job; the table is left out.\n")
    table = ctx.cross_rank
    if table is None:
        return ""
    transfer = (f"the collectives' transfer and wait, two readings side by side: {appendix_link(TRANSFER_HEADING)}"
                if _transfer_table(table) else "")
    if ctx.folder.figures("05_cross_rank"):
        text = (f"\nAcross ranks: each category's busy time per step spreads as the figure above shows "
                f"({appendix_link(CROSS_RANK_HEADING, 'table')})" + (f"; {transfer}" if transfer else "") + ".\n")
    else:
        text = "\nAcross ranks (busy ms per step):\n\n" + _cross_rank_spread(table)
        text += f"\n{transfer[0].upper() + transfer[1:]}.\n" if transfer else ""
    return text + _transfer_reading_notes(ctx.transfer_readings)


CROSS_RANK_HEADING = "Busy time per category across ranks (stage 05, ms per step)"
TRANSFER_HEADING = "Collective transfer and wait (stage 05)"


def _transfer_table(table: pd.DataFrame | None) -> str:
    """The collectives' two transfer readings and their waits (`table`: `cross_rank_table`), under
    `TRANSFER_HEADING` for the appendix; '' without collectives seen on several ranks."""
    if table is None or "transfer_ms_est" not in table:
        return ""
    comm = table[table["transfer_ms_est"].notna()]
    if not len(comm):  # the transfer and wait readings exist for collectives only
        return ""
    return appendix_table(TRANSFER_HEADING, (
        "For a collective, the least-waiting rank's mean time estimates the transfer (its own waits "
        "included); the transfer matched instance by instance (last arrival to the median end), which the "
        "verdict uses, stands beside it when stage 05 matched the collectives:\n\n")
        + compact_table(comm, [("category", "category"), ("transfer_ms_est", "transfer est. (least-waiting rank)"),
                               ("transfer_ms_matched", "transfer (matched instances)"),
                               ("wait_ms_median", "wait (median)"), ("wait_ms_max", "wait (max)")],
                        keys=("category",)))


def _transfer_reading_notes(readings: pd.DataFrame | None) -> str:
    """One line per collective whose two transfer readings cannot be compared or disagree."""
    if readings is None:
        return ""
    lines = [f"- {md_text(r.category)}: {fmt_num(r.n_asymmetric)} of {fmt_num(r.n_instances)} matched instances "
             f"are asymmetric (a rank finished before the last one arrived: a gather to one rank, or "
             f"a wait elsewhere) and have no transfer time, so the matched figure covers the other "
             f"{fmt_num(r.n_instances - r.n_asymmetric)} only and is not set against the estimate."
             for r in readings.itertuples() if r.agree is None]
    off = [r for r in readings.itertuples() if r.agree is False]
    both = [f"{fmt_pct(r.rel_diff)} ({fmt_num(r.transfer_ms_est)} ms the least-waiting rank's mean, "
            f"{fmt_num(r.transfer_ms_matched)} ms matched instance by instance" for r in off]
    agree, why = (fmt_pct(READINGS_AGREE_REL), "the rank that waits least on average still waits on "
                  "some calls, or finishes before the typical rank.")
    if len(off) == 1:
        lines.append(f"- ⚠ {md_text(off[0].category)}: the two transfer readings differ by {both[0]}; they agree "
                     f"within {agree}): {why}")
    elif off:  # one line for all of them: the reason is the same, and what each reading is, said once
        lines.append(f"- ⚠ The two transfer readings, the least-waiting rank's mean against the one matched instance "
                     f"by instance, differ beyond the {agree} within which they agree: "
                     + ", ".join(f"{md_text(r.category)} by {fmt_pct(r.rel_diff)} ({fmt_num(r.transfer_ms_est)} against "
                                 f"{fmt_num(r.transfer_ms_matched)} ms)" for r in off) + f": {why}")
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


WHY_COUNTS_DIFFER = " Observed counts can differ when"
"""Where stage 05's expected-collectives reasoning (`model.shapes.explain_collectives`) turns to
why a count may differ: the report leaves that part out when every count matched."""


def _section_crosschecks(a: RunArtifacts, ctx: ReportContext) -> str:
    label = ctx.ident.step_label
    text = f"## Cross-checks\n\n### Collectives {per_step(label) if label == WINDOW else 'per ' + label}\n\n"
    ts = a.trace_summary
    if ts is not None:
        cc = ts.collectives_check
        exp, obs = collective_counts(cc.expected), collective_counts(cc.observed)
        if exp or obs:
            seen = "observed (in the window)" if label == WINDOW else "observed (median per step)"
            rows = [{"collective": k, "expected": exp.get(k), seen: obs.get(k)}
                    for k in dict.fromkeys(list(exp) + list(obs))
                    if exp.get(k) is not None or obs.get(k)]  # an absent kind nobody expected says nothing
            n = cc.observed.n_steps
            text += (f"Counted on rank {cc.rank if cc.rank is not None else 0}"
                     + (f" over {prose.steps(n, label)}" if n or label == WINDOW else "")
                     + (f", TP={cc.tp}" if cc.tp else "") + ":\n\n")
            if rows:
                df = pd.DataFrame(rows)
                df["match"] = ["–" if e is None or o is None else ("yes" if e == o else "**no**")
                               for e, o in zip(df["expected"], df[seen])]
                text += md_table(df, md_columns=("match",))
            else:
                text += f"No collective ran {in_steps(label)}.\n"
        reasoning = cc.expected.reasoning if cc.expected is not None else None
        if reasoning and exp and all(obs.get(k) == n for k, n in exp.items()):
            reasoning = reasoning.split(WHY_COUNTS_DIFFER)[0].strip()  # nothing differed to explain
        if reasoning:
            text += f"\nExpected from the architecture: {md_text(words(reasoning))}\n"
        expl = words(cc.explanation)
        if expl:
            text += f"\n{md_text(expl[0].upper() + expl[1:])}\n"
    else:
        text += missing_box("The architecture cross-check", ["05_categorize/summary.json (collectives_check)"])
    text += "\n### Trace against micro-benchmark predictions\n\n"
    mvt = ctx.mvt
    if mvt is not None and mvt["micro_predicted_ms_per_step"].notna().any():
        text += (f"Agreement means the ratio trace / prediction is within 1 ± {an.PREDICTION_TOLERANCE:g}.\n\n")
        text += md_table(mvt, [("quantity", "quantity"), ("trace_ms_per_step", "trace ms/step"),
                               ("micro_predicted_ms_per_step", "predicted ms/step"),
                               ("ratio_trace_over_micro", "trace / predicted"), ("agree", "agree?"),
                               ("prediction_method", "prediction"),
                               ("trace_implementation", "what the trace ran")], md_columns=("trace_implementation",))
        text += prose.step_prediction_table(ctx.verdict.step_prediction)
    else:
        text += missing_box("Trace against prediction", list(ctx.folder.files_absent)
                            or ["a GEMM or communication prediction"])
    text += "\n### Profiler text table against the trace\n\n"
    tt = ts.text_table_check if ts is not None else []
    if tt and all(c.self_cuda_total_us is None for c in tt):  # CPU tables: nothing to set against the trace
        cpu = [c for c in tt if c.self_cpu_total_us is not None]
        ranks = [c.rank for c in cpu]
        by_rank = None not in ranks and len(set(ranks)) == len(ranks)  # else the file names tell them apart
        totals = "; ".join(f"{f'rank {c.rank}' if by_rank else md_text(Path(c.file).name)} "
                           f"{fmt_num(c.self_cpu_total_us)} µs" for c in cpu)
        text += (f"No text table holds a kernel total to set against the trace: {md_text(tt[0].remark())}"
                 + (f" (Self CPU totals: {totals})" if totals else "") + ".\n")
    elif tt:
        text += ("The text table's `Self CUDA time total` against the trace's summed kernel time (a difference "
                 "above 1 % is flagged; a CPU op's CUDA time is never added as kernel time):\n\n")
        df = pd.DataFrame([{"file": Path(c.file).name, "rank": c.rank, "layout": c.layout,
                            "self_cuda_total_us": c.self_cuda_total_us, "trace_kernel_sum_us": c.trace_kernel_sum_us,
                            "diff_pct": None if c.rel_diff is None else 100 * c.rel_diff,
                            "self_cpu_total_us": c.self_cpu_total_us, "remark": c.remark()} for c in tt])
        cols = [("file", "file"), ("rank", "rank"), ("layout", "layout"),
                ("self_cuda_total_us", "Self CUDA total µs"), ("trace_kernel_sum_us", "trace kernel sum µs"),
                ("diff_pct", "difference %"), ("self_cpu_total_us", "Self CPU total µs"), ("remark", "remark")]
        text += compact_table(df, cols, keys=("file",))
    else:
        text += missing_box("The text-table cross-check", ["profiler_out_*.txt parsed into 05_categorize/summary.json"])
    return text


def _section_verdict(ctx: ReportContext) -> str:
    text = "## Verdict\n\n"
    v: vd.Verdict = ctx.verdict
    am = ctx.amdahl
    if v.dominant is None and v.failed_guards:
        # Withdrawn, not missing: the guards say why, and the trace is described instead.
        return text + "**Verdict withheld.**\n\n" + _finding_list(v)
    if v.dominant is None:
        return text + missing_box("The verdict", ["05_categorize/decode_categories.csv"])
    d = v.dominant
    text += (f"**Dominant category: {md_text(d.category)}**, {fmt_num(d.share_pct)} % of a {d.step_label} "
             f"({d.denominator}). The findings, one per line:\n\n" + _finding_list(v) + "\n")
    if v.levers:
        text += _lever_table(v)
        if "amdahl" in ctx.figs:
            text += "\n" + _img(ctx.figs["amdahl"], "Amdahl ceiling per category")
    elif am is None:
        text += missing_box("Amdahl ceilings", ["05_categorize/amdahl.csv"])
    if v.roofline:  # each row is a finding above: the table is the appendix's
        text += f"\nThe on-trace roofline of the GEMM categories as one table: [appendix]({APPENDIX_MD}#measurements-in-full).\n"
    elif v.roofline_reason:
        text += f"\nNo roofline on the trace: {md_text(v.roofline_reason)}.\n"
    return text


def _roofline_table(v: vd.Verdict) -> str:
    """The on-trace roofline of the GEMM categories (stage 05), for the appendix; '' without one."""
    if not v.roofline:
        return ""
    return ("### On-trace roofline of the GEMM categories (stage 05; % of the device's peak)\n\n"
            + compact_table(pd.DataFrame([msgspec.structs.asdict(r) for r in v.roofline]),
                            [("category", "category"), ("time_ms_per_step", per_step_header("ms", v.identity.step_label)),
                             ("achieved_gbps", "GB/s"), ("pct_peak_bw", "% peak bandwidth"),
                             ("achieved_tflops", "TFLOP/s"), ("pct_peak_flops", "% peak compute"),
                             ("micro_gbps", "stage 02 GB/s"), ("micro_vs_trace", "trace / stage 02"),
                             ("device", "device")], keys=("category",)))


def _finding_list(v: vd.Verdict) -> str:
    """The verdict's sentences as a list, one bullet per finding: consecutive sentences written
    from the same findings (a split's transfer and wait) share theirs."""
    bullets: list[tuple[tuple, list[str]]] = []
    for src, sentence in prose.sentences(v):
        if bullets and bullets[-1][0] == src:
            bullets[-1][1].append(sentence)
        else:
            bullets.append((src, [sentence]))
    return "".join(f"- {' '.join(said)}\n" for _, said in bullets)


LEVER_TABLE_MIN_X = 1.01
"""Category levers below this ceiling are named in one line under the table, not given a row each."""


def _lever_table(v: vd.Verdict) -> str:
    """Every lever's Amdahl ceiling in one table, biggest first: the categories' exposed time,
    the time between steps and the gaps inside the step, on the verdict's one basis."""
    label = v.identity.step_label
    rows = [{"lever": lv.category, "ms": lv.exposed_ms, "x": lv.ceiling_x} for lv in v.levers]
    if v.between_steps is not None:
        rows.append({"lever": prose.lever_name(v.between_steps), "ms": v.between_steps.gap_ms,
                     "x": v.between_steps.ceiling_x})
    rows += [{"lever": prose.lever_name(g), "ms": g.idle_ms, "x": g.ceiling_x} for g in v.gap_levers]
    rows.sort(key=lambda r: -r["x"])
    shown = [r for r in rows if r["x"] >= LEVER_TABLE_MIN_X] or rows[:1]
    small = [md_text(r["lever"]) for r in rows if r not in shown]
    text = (f"\nAmdahl ceilings, on the {v.basis.denominator} of {fmt_num(v.basis.step_ms)} ms: removing a lever's "
            f"time makes a {label} at most {v.basis.denominator} / ({v.basis.denominator} − its time) faster "
            "(a category's exposed time: what no higher-priority work covers):\n\n")
    text += md_table(pd.DataFrame(shown), [("lever", "lever"), ("ms", f"removable {per_step_header('ms', label)}"),
                                           ("x", f"{label} at most × faster")])
    if small:
        text += f"\nUnder {fmt_num(LEVER_TABLE_MIN_X)}× each: {', '.join(small)} (every category is in the figure).\n"
    return text


def _section_whatif(ctx: ReportContext) -> str:
    text = "## What-if: speculative / multi-token decoding\n\n"
    w, ident = ctx.whatif, ctx.ident
    if not ident.takes_decode_verdict:
        what = (prose.KIND_PHRASES.get(ident.kind, f"a {ident.kind} trace") if ident.kind != "unknown"
                else "a trace with no step labelled decode")
        why = (": a mixed step's GEMMs do a prefill's work, which the what-if's constant GEMM time (decode reads "
               "the weights once per step) does not describe" if ident.kind == "mixed" else "")
        return text + (f"Not projected: this is {what}, and speculative decoding changes decode steps "
                       f"only{why}.\n")
    if w is None:
        return text + missing_box("The projection", ["05_categorize/decode_categories.csv",
                                                     "04_profiler_capture/capture_latency.json"])
    in_appendix = _whatif_table_in_appendix(ctx)
    text += _whatif_grid(w, in_appendix) + _whatif_warnings(ctx)
    if not in_appendix:
        text += _whatif_table(w.predictions)
        if w.parts_assumed:  # what a default assumed is read beside the projection it changes
            text += "\n" + PARTS_INTRO + _parts_table(w.baseline, w.predictions)
        else:
            text += f"\nHow each part of the measured step grows in a verify step: {appendix_link(WHATIF_PARTS_HEADING)}.\n"
    best, worst = w.best, w.worst
    text += (f"\nThe best case here, acceptance {fmt_num(best.acceptance_length)} with {fmt_num(best.draft_tokens)} "
             f"drafted tokens at {fmt_num(best.draft_per_token_ms)} ms each, projects "
             f"{fmt_num(best.tpot_ms)} ms TPOT ({fmt_num(best.tok_s_per_stream)} tok/s per stream, "
             f"{fmt_num(best.speedup)}× the measured step).\n")
    if in_appendix and worst.speedup < 1:  # the table that showed it is the appendix's
        text += (f"\nThe worst, acceptance {fmt_num(worst.acceptance_length)} with {fmt_num(worst.draft_tokens)} drafted "
                 f"tokens, projects {fmt_num(worst.tpot_ms)} ms TPOT: slower than the measured step "
                 f"({fmt_num(worst.speedup)}×).\n")
    if "whatif" in ctx.figs:
        text += "\n" + _img(ctx.figs["whatif"], "speculative decoding what-if")
    return text + _whatif_under_load(w.load_rows, best)


def _whatif_grid(w: WhatIfProjection, in_appendix: bool) -> str:
    """What the what-if projects from and over which grid, and where its table and method are."""
    base, batch = w.baseline, w.predictions[0].batch
    grid = (f"Projected from the measured decode step of **{fmt_num(base.step_ms)} ms** ({base.step_basis}) at "
            f"**{fmt_num(batch)} {plural('request', batch)} per step**, for acceptance lengths {list(w.acceptance_lengths)} "
            f"and draft costs {list(w.draft_cost_fractions)} of a measured step per drafted token")
    if in_appendix:
        return (f"{grid}: the figure below; the table, its method and how each part of the step grows in a verify "
                f"step: {appendix_link(WHATIF_HEADING)}.\n")
    return f"{grid}: {whatif_method(w.verify_extra_tokens)}\n\n"


def _whatif_warnings(ctx: ReportContext) -> str:
    """What makes the measured step a poor baseline: speculative decoding already on, a stall in
    it, too few steps."""
    text, ident = "", ctx.ident
    sd = ctx.verdict.spec_decode
    if sd is not None:
        text += (f"**This run already decodes speculatively** ({fmt_num(sd.n_verify_steps)} of "
                 f"{fmt_num(sd.n_decode_steps)} decode steps verify drafts): the baseline below mixes plain and "
                 f"verify steps, so set a projection against a run without speculative decoding instead.\n\n")
    b = ctx.verdict.boundness
    if b is not None and b.status in ("stall", "host gap"):
        text += (f"**The measured step holds one {fmt_num(b.largest_gap_ms)} ms stall** (see the verdict), which "
                 f"the projection carries unchanged in every row: remove the stall first, or read these figures "
                 f"as a bound set by it.\n\n")
    if ident.low_confidence:
        text += (f"Low confidence: the baseline is {fmt_num(ident.n_judged_steps)} {ident.step_label}(s) "
                 f"(fewer than {fmt_num(ident.min_steps)}).\n\n")
    return text


def whatif_method(verify_extra_tokens: int) -> str:
    """How the what-if projects a TPOT, in one clause."""
    return (f"a verify step scores M = k + 1 tokens per request (k = ⌈acceptance⌉ − 1 + {verify_extra_tokens}); "
            "TPOT = (verify step + k × draft per token) / acceptance (`report.whatif.predict_spec_decode_tpot`).")


WHATIF_HEADING = "The what-if at the measured batch"
WHATIF_PARTS_HEADING = "The what-if's step, part by part"


def _whatif_table_in_appendix(ctx: ReportContext) -> bool:
    """The batch-1 projection's table goes to the appendix where the figure draws it and no part
    of the step grew by a default (a default is read beside the projection it changes)."""
    w = ctx.whatif
    return w is not None and bool(w.predictions) and "whatif" in ctx.figs and not w.parts_assumed


def _whatif_table(preds: list[wi.Prediction]) -> str:
    rows = [{"acceptance": p.acceptance_length, "k": p.draft_tokens, "M": p.verify_tokens, "batch": p.batch,
             "draft_per_token_ms": p.draft_per_token_ms, "verify_ms": p.verify_ms, "draft_ms": p.draft_ms,
             "tpot_ms": p.tpot_ms, "tok_s": p.tok_s_per_stream, "speedup": p.speedup,
             "defaults": _defaulted(p.assumptions)}
            for p in preds]
    return compact_table(pd.DataFrame(rows), [
        ("acceptance", "acceptance"), ("k", "drafted k"), ("M", "verify M"), ("batch", "batch"),
        ("draft_per_token_ms", "draft ms/token"), ("verify_ms", "verify ms"), ("draft_ms", "draft ms"),
        ("tpot_ms", "TPOT ms"), ("tok_s", "tok/s per stream"), ("speedup", "speed-up"),
        ("defaults", "assumed by default")], keys=("acceptance", "k", "M"), settings=("batch",))


PARTS_INTRO = ("How each part of the measured step grows in a verify step (exposed ms per step; × at each M; "
               "`default` marks an assumption where a stage's measurement was missing):\n\n")


def _parts_assumed(preds: list[wi.Prediction]) -> bool:
    """Whether a part of the what-if's step grew by a default, not by a stage's measurement."""
    return any(not x.startswith(("k = ", "batch:")) for p in preds for x in p.assumptions)


def _parts_table(base: wi.SpecBaseline, preds: list[wi.Prediction]) -> str:
    """The measured step's parts, one row per way of growing (law, source and × at each M alike),
    each part named with its measured ms."""
    by_m = dict(sorted({p.verify_tokens: p for p in preds}.items()))
    groups: dict[tuple, list[str]] = {}
    for i, part in enumerate(base.parts):
        src = next(iter(by_m.values())).parts[i].source
        key = (wi.LAWS[part.law], src, *(p.parts[i].scale for p in by_m.values()))
        groups.setdefault(key, []).append(f"{md_text(part.name)} {fmt_num(part.ms)}")
    rows = [{"parts": ", ".join(names), "law": key[0], "source": key[1],
             **{f"x{m}": x for m, x in zip(by_m, key[2:])}} for key, names in groups.items()]
    return md_table(pd.DataFrame(rows), [("parts", "parts (measured ms)"), ("law", "grows with")]
                    + [(f"x{m}", f"× at M={m}") for m in by_m] + [("source", "source")], md_columns=("parts",))


WHATIF_LOAD_HEADING = "The what-if under load"
WHATIF_LOAD_INTRO = ("Each captured level's own decode step (`load_anatomy.csv`) projected at **the batch that trace "
                     "measured**: a verify step there scores batch × M tokens, and the GEMMs and all-reduces grow "
                     "along stage 02's and 03's curves from it. Same grid as above.\n\n")


def _whatif_load_rows(levels: list[tuple[wi.SpecBaseline, list[wi.Prediction]]]) -> list[dict]:
    rows = []
    for base, preds in levels:
        best = max(preds, key=lambda p: p.speedup)
        worst = min(preds, key=lambda p: p.speedup)
        assumed = [x.split(":", 1)[0] for x in best.assumptions if not x.startswith(("k = ", "batch:"))]
        rows.append({"concurrency": base.concurrency, "batch": base.batch, "step_ms": base.step_ms,
                     "best": best.speedup, "best_tpot": best.tpot_ms, "worst": worst.speedup,
                     "assumed": ", ".join(assumed) or "no default used"})
    return rows


def _whatif_load_table(rows: list[dict]) -> str:
    return compact_table(pd.DataFrame(rows), [
        ("concurrency", "concurrency"), ("batch", "batch (measured)"), ("step_ms", "measured step ms"),
        ("best", "best speed-up"), ("best_tpot", "best TPOT ms"), ("worst", "worst speed-up"),
        ("assumed", "assumed by default (×1: no stage 02 or 03 curve)")], keys=("concurrency",),
        formats={"concurrency": lambda v: f"{int(v)}"})


def _whatif_load_moved(rows: list[dict]) -> bool:
    """The table goes to the appendix unless a level's row assumed a default (read beside it)."""
    return bool(rows) and all(r["assumed"] == "no default used" for r in rows)


def _whatif_under_load(rows: list[dict[str, Any]], batch1: wi.Prediction) -> str:
    """The what-if at each captured load level (`_whatif_load_rows`), each at the batch its own trace
    measured (issue 22): speculative decoding's gain at batch 1 says nothing of the plateau's batch."""
    if not rows:
        return ""
    text = "\n### Under load: at the batch each level was measured at\n\n"
    if _whatif_load_moved(rows):
        text += ("Each captured level's own decode step projected at the batch its trace measured, on the same grid: "
                 f"{appendix_link(WHATIF_LOAD_HEADING)}.\n")
    else:
        text += WHATIF_LOAD_INTRO + _whatif_load_table(rows)
    top = max(rows, key=lambda r: r["concurrency"])
    verb = "still gains" if top["best"] > 1 else "loses"
    return text + (f"\nAt c={top['concurrency']} ({fmt_num(top['batch'])} decode requests per step, measured) the best "
                   f"case {verb}: {fmt_num(top['best'])}× the measured step, against {fmt_num(batch1.speedup)}× at "
                   f"batch {fmt_num(batch1.batch)}.\n")


def _defaulted(assumptions: tuple[str, ...]) -> str:
    """A prediction row's defaults: the batch's in full, the parts' by name (what each part
    assumed is said once, in the parts table below)."""
    batch = [x for x in assumptions if x.startswith("batch:")]
    parts = [x.split(":", 1)[0] for x in assumptions if not x.startswith(("k = ", "batch:"))]
    said = batch + ([", ".join(parts) + " (below)"] if parts else [])
    return "; ".join(said) or "no default used"


def _section_caveats(items: list[str], held: Sequence[str] = ()) -> str:
    """The caveats as a list; the checks that held as one line after it, so a reassurance is
    never read as a caveat."""
    listed, tables = per_level_table(per_level_once(items))
    text = "## Caveats\n\n" + ("\n".join(f"- {c}" for c in listed) if items
                               else "No data-quality flag was raised.") + "\n"
    text += "".join(f"\n{t}" for t in tables)
    return text + (f"\nChecks that held: {'; '.join(held)}.\n" if held else "")


_PER_LEVEL = re.compile(r"\[01\] level (\S+): (\d+%) (.+)")
"""Stage 01's flag said of one sweep level with its share (`sweep.run`): bunched or merged chunks."""


def _level_groups(items: list[str], pattern: re.Pattern) -> dict[str, list[tuple[str, str]]]:
    """{what the flag says: [(level, its number), ...]} over the flags `pattern` matches."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for c in items:
        if m := pattern.fullmatch(c):
            groups.setdefault(m[3], []).append((m[1], m[2]))
    return groups


def per_level_once(items: list[str]) -> list[str]:
    """Stage 01's flags that say one thing of several levels, as one line naming each level and
    its share (five "chunks bunched" lines were the longest part of the caveats)."""
    groups = _level_groups(items, _PER_LEVEL)
    out: list[str] = []
    for c in items:
        m = _PER_LEVEL.fullmatch(c)
        if m is None or len(groups[m[3]]) < 2:
            out.append(c)
        elif groups[m[3]][0][0] == m[1]:  # the group's line, where its first level's stood
            levels = ", ".join(f"{lv} ({share})" for lv, share in groups[m[3]])
            out.append(f"[01] levels {levels}: that share {m[3]}")
    return out


_LEVEL_DETAIL = re.compile(r"\[01\] level (\S+): (.+?\)): (.+)")
"""Stage 01's flag of one sweep level as its numbers, then what they mean (`sweep.run`: stalls)."""


def per_level_table(items: list[str]) -> tuple[list[str], list[str]]:
    """Stage 01's flags that explain several levels alike: one line naming the levels, and a table
    of their numbers. Returns (the caveat lines, the tables to print after them)."""
    groups = _level_groups(items, _LEVEL_DETAIL)
    out: list[str] = []
    tables: list[str] = []
    for c in items:
        m = _LEVEL_DETAIL.fullmatch(c)
        if m is None or len(groups[m[3]]) < 2:
            out.append(c)
        elif groups[m[3]][0][0] == m[1]:  # the group's line, where its first level's stood
            rows = groups[m[3]]
            out.append(f"[01] levels {', '.join(lv for lv, _ in rows)} (their numbers in the table below): {m[3]}")
            # the lines are escaped already (prose.caveat_text)
            tables.append(kv_table([(Md(lv), Md(detail)) for lv, detail in rows], ("level", "[01] flag")))
    return out, tables


def _why(a: RunArtifacts, stage_id: str) -> str | None:
    st = a.stage_status(stage_id)
    if st is None:
        return None
    return f"stage status: {st.status}" + (f": {st.error}" if st.error else "")


# --------------------------------------------------------------------------- entry point


@dataclasses.dataclass(frozen=True)
class RunFolderListing:
    """What the report takes from the run folder beyond RunArtifacts, read when the context is
    built, so rendering reads no file (a run folder moved away renders the same report)."""

    stages_present: frozenset[str]
    """Stage folders holding any file (`RunArtifacts.stage_present`)."""
    figure_names: tuple[str, ...]
    """PNG names in figures/ before the report draws its own: the stages' plots it links."""
    perfetto_merged: bool
    """Whether stage 05 wrote its merged Perfetto file (`trace.perfetto.MERGED_NAME`)."""
    files_absent: tuple[str, ...]
    """Of the trace-against-prediction inputs (`PREDICTION_INPUTS`), those not in the run folder."""

    def figures(self, prefix: str) -> list[str]:
        """The stage plots whose names start with `prefix`, sorted."""
        return sorted(n for n in self.figure_names if n.startswith(prefix))


PREDICTION_INPUTS = ("02_gemm_micro/prediction.json", "03_nccl_burst/prediction.json",
                     "05_categorize/decode_categories.csv")
"""The files a trace-against-prediction table reads; the box that says it is missing names the absent ones."""


def folder_listing(run_dir: Path) -> RunFolderListing:
    """The run folder's listing the report's sections read (`RunFolderListing`)."""
    from stepscope.trace.perfetto import MERGED_NAME

    stages = frozenset(d.name for d in run_dir.iterdir() if d.is_dir() and any(d.iterdir())) if run_dir.is_dir() \
        else frozenset()
    figures = run_dir / "figures"
    return RunFolderListing(
        stages_present=stages,
        figure_names=tuple(sorted(p.name for p in figures.glob("*.png"))) if figures.is_dir() else (),
        perfetto_merged=(run_dir / "05_categorize" / "perfetto" / MERGED_NAME).is_file(),
        files_absent=tuple(f for f in PREDICTION_INPUTS if not (run_dir / f).is_file()))


@dataclasses.dataclass(frozen=True)
class WhatIfProjection:
    """The speculative-decoding what-if (`report.whatif`), projected from the measured decode step."""

    baseline: wi.SpecBaseline
    """The measured decode step (ms, its parts) at the capture's batch."""
    predictions: list[wi.Prediction]
    """One per point of the writeup params' grid (acceptance × draft cost)."""
    acceptance_lengths: tuple[float, ...]
    """`writeup.acceptance_lengths`: the grid's mean tokens emitted per verify step."""
    draft_cost_fractions: tuple[float, ...]
    """`writeup.draft_cost_fractions`: the grid's draft cost per drafted token, as a fraction of a measured step."""
    verify_extra_tokens: int
    """`writeup.verify_extra_tokens`, which the method line states."""
    curves: pd.DataFrame
    """The figure's rows: acceptance_length, tpot_ms_projected, draft_cost_fraction (of a step per drafted token)."""
    load: list[tuple[wi.SpecBaseline, list[wi.Prediction]]]
    """Each captured load level's own step and its grid, at the batch that level's trace measured."""
    load_rows: list[dict[str, Any]]
    """One row per load level: its best and worst speed-up (×), best TPOT (ms), the defaults it assumed."""

    @property
    def best(self) -> wi.Prediction:
        return max(self.predictions, key=lambda p: p.speedup)

    @property
    def worst(self) -> wi.Prediction:
        return min(self.predictions, key=lambda p: p.speedup)

    @property
    def parts_assumed(self) -> bool:
        return _parts_assumed(self.predictions)


@dataclasses.dataclass(frozen=True)
class ReportContext:
    """Every derived number the report shows, computed once (`report_context`); the sections render it."""

    totals: dict[str, Any]
    """The step read several ways, ms per step, with stage 05's basis (`analysis.decode_step_totals`)."""
    decode: pd.DataFrame | None
    """Per category: ms per step, % of step, calls per step, µs per call (`analysis.decode_category_table`)."""
    amdahl: pd.DataFrame | None
    """Stage 05's Amdahl ceilings (×) per category, on its step basis (amdahl.csv)."""
    mvt: pd.DataFrame | None
    """Trace against micro-benchmark predictions, ms per step and their ratio (`analysis.micro_vs_trace`)."""
    macro: dict[str, Any]
    """The sweep's headline readings: knee, plateau tok/s, c=1 TPOT and TTFT ms (`analysis.macro_headlines`)."""
    verdict: vd.Verdict
    """The findings, guards applied (`report.verdict`, `report.guards`)."""
    whatif: WhatIfProjection | None
    """The speculative-decoding projection; None where the trace takes no decode verdict or has no step."""
    micro: list[Any]
    """The micro-predicted curve, one point per closed-loop sweep level (`report.load.micro_curve`)."""
    levels: pd.DataFrame | None
    """The sweep's levels in table order, shares also as % (`sweep_levels`); None without a sweep."""
    cross_rank: pd.DataFrame | None
    """Busy ms per step per category across ranks, with the matched transfer (`cross_rank_table`)."""
    transfer_readings: pd.DataFrame | None
    """Each collective's two transfer readings, ms per step (`analysis.transfer_readings`)."""
    kinds: pd.DataFrame | None
    """Stage 05's per-kind rows of the reference rank (`kinds.kind_table`); None with one kind's table absent."""
    caveats: list[str]
    """Every caveat as the Caveats section lists it, escaped markdown (`verdict.caveats`, `prose.caveat_text`)."""
    checks_held: list[str]
    """The checks that held, clauses of one line (`analysis.checks_held`)."""
    folder: RunFolderListing
    """The run folder's listing, read when the context was built."""
    figs: dict[str, str] = dataclasses.field(default_factory=dict)
    """{figure key: file name in figures/} of the figures the report drew (`make_figures`); empty when none."""

    @property
    def ident(self) -> vd.TraceIdentity:
        return self.verdict.identity


def _whatif(a: RunArtifacts, wp: WriteupParams, totals: dict[str, Any], decode: pd.DataFrame | None,
            ident: vd.TraceIdentity) -> WhatIfProjection | None:
    """The what-if at the capture's batch and at each captured load level; None without a decode step."""
    baseline = wi.spec_baseline(a, totals, decode, batch=ident.batch_size) if ident.takes_decode_verdict else None
    if baseline is None:
        return None

    def grid(b: wi.SpecBaseline) -> list[wi.Prediction]:
        return wi.whatif_table(b, wp.acceptance_lengths, wp.draft_cost_fractions, wp.verify_extra_tokens)
    preds = grid(baseline)
    load = [(b, grid(b)) for b in wi.load_baselines(a)]
    # Rounded: the fraction recomputed from ms (0.09999999999999999) must be one group key per params value.
    curves = pd.DataFrame([{"acceptance_length": p.acceptance_length, "tpot_ms_projected": p.tpot_ms,
                            "draft_cost_fraction": round(p.draft_ms / p.draft_tokens / baseline.step_ms, 9)}
                           for p in preds])
    return WhatIfProjection(baseline=baseline, predictions=preds, acceptance_lengths=tuple(wp.acceptance_lengths),
                            draft_cost_fractions=tuple(wp.draft_cost_fractions),
                            verify_extra_tokens=wp.verify_extra_tokens, curves=curves, load=load,
                            load_rows=_whatif_load_rows(load))


def report_context(a: RunArtifacts, wp: WriteupParams) -> ReportContext:
    """Every derived number the report shows, computed once, and every file it reads, read now."""
    totals = an.decode_step_totals(a)
    decode = an.decode_category_table(a, totals)
    amdahl = a.amdahl  # stage 05's ceilings, on its step basis
    mvt = an.micro_vs_trace(a)
    macro = an.macro_headlines(a)
    verdict = guards.guarded(vd.verdict(a, totals, decode, amdahl, mvt, macro), a, totals, decode)
    ident = verdict.identity
    caveats = [prose.caveat_text(c, verdict) for c in verdict.caveats]
    readings = an.transfer_readings(a)
    return ReportContext(
        totals=totals, decode=decode, amdahl=amdahl, mvt=mvt, macro=macro, verdict=verdict,
        whatif=_whatif(a, wp, totals, decode, ident), micro=micro_curve(a), levels=sweep_levels(a.levels),
        cross_rank=cross_rank_table(a.cross_rank, readings, verdict.comm_split), transfer_readings=readings,
        kinds=kind_table(a.run_dir, a.decode.rank), caveats=caveats,
        checks_held=an.checks_held(a, ident.step_label), folder=folder_listing(a.run_dir))


def report_title(a: RunArtifacts, ctx: ReportContext, wp: WriteupParams) -> str:
    """The report's title as plain text: `writeup.title`, else the question for this run."""
    run_id = a.run.run_id if a.run is not None else a.run_dir.name
    step = ctx.ident.step_label   # a prefill or training trace is not called decode
    return wp.title or f"Where does a {step}'s time go? Run {run_id}"


def render_report_markdown(a: RunArtifacts, ctx: ReportContext, wp: WriteupParams) -> str:
    """The report: the opening screen, then the sections in reading order, numbered."""
    stages = ctx.folder.stages_present
    head = opening(a, ctx.verdict, md_text(report_title(a, ctx, wp)), stages) + "[TOC]\n\n"
    # A trace-only run never measured a server: its opening says so once, instead of a box per stage.
    measured = [] if trace_only(a, stages) else [_section_macro(a, ctx), _section_micro(a, ctx)]
    sections = [_section_setup(a, ctx), *measured, _section_breakdown(a, ctx), *_section_load(a, ctx),
                _section_crosschecks(a, ctx), _section_verdict(ctx), _section_whatif(ctx),
                _section_caveats(ctx.caveats, ctx.checks_held)]
    return head + number_sections("\n".join(sections))


def build_report(run_dir: str | Path, writeup: WriteupParams | None = None, *,
                 draw_figures: bool = True) -> dict[str, Path]:
    """Write 06_writeup/ (report, appendix, verdict.json) from the run folder alone; returns their
    paths and one `figure_<key>` per figure. `draw_figures=False` renders text only (seconds faster)."""
    a = load_run_artifacts(run_dir)
    wp = writeup_params_from(a, writeup)
    ctx = report_context(a, wp)
    if draw_figures:
        ctx = dataclasses.replace(ctx, figs=make_figures(a, ctx))
    text = render_report_markdown(a, ctx, wp)
    title = report_title(a, ctx, wp)
    out_dir = a.run_dir / STAGE_ID
    out_dir.mkdir(parents=True, exist_ok=True)
    v = ctx.verdict
    # The findings as data, for the CLI's closing lines and exit code (and whoever reads a run).
    verdict_path = schema.write(out_dir / "verdict.json", vd.with_sentences(
        v, prose.headline_sentences(v), prose.sentences(v)), schema.VerdictFile)
    md_path = out_dir / REPORT_MD
    md_path.write_text(scrub(text.replace("[TOC]\n\n", "")))
    html_path = out_dir / REPORT_HTML
    html_text = text.replace(f"]({APPENDIX_MD}", f"]({APPENDIX_HTML}")  # anchors kept
    html_path.write_text(scrub(markdown_to_html(scrub(html_text), out_dir, title, figure_dirs=(a.run_dir / "figures",))))
    appendix_md, appendix_html = write_appendix(a, out_dir, title, appendix_tables(a, ctx))
    paths: dict[str, Path] = {"markdown": md_path, "html": html_path, "appendix_markdown": appendix_md,
                              "appendix_html": appendix_html, "verdict": verdict_path, "figures": a.run_dir / "figures"}
    for key, name in ctx.figs.items():
        paths[f"figure_{key}"] = a.run_dir / "figures" / name
    return paths


def report_markdown_for_notebook(md_path: str | Path, run_dir: str | Path, cwd: str | Path | None = None) -> str:
    """report.md with its figure links made relative to where the notebook is viewed: `<run_dir>/notebooks/`
    for an absolute run_dir (the runner's), else the working directory (an interactive session)."""
    run_dir = Path(run_dir)
    view_dir = run_dir / "notebooks" if run_dir.is_absolute() else Path(cwd or Path.cwd())
    rel = os.path.relpath((run_dir / "figures").resolve() if not run_dir.is_absolute() else run_dir / "figures",
                          view_dir.resolve() if not run_dir.is_absolute() else view_dir)
    text = Path(md_path).read_text().replace(f"]({FIGURE_LINK_PREFIX}", f"]({Path(rel).as_posix()}/")
    appendix = Path(rel).parent / STAGE_ID / APPENDIX_MD  # beside report.md, seen from the notebook's folder
    return text.replace(f"]({APPENDIX_MD}", f"]({appendix.as_posix()}")
