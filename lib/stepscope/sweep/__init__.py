"""Stage 01: closed- and open-loop load against the server; serving metrics.

Entry points: `load_server(run_dir)` (reads 00_deploy/server.json), `run_sweep(server,
params.sweep, out_dir)`, `finish(out_dir, knee_gain)` (tables from what is on disk),
`import_vllm_results(paths)` (vllm bench serve --save-result files into the same table),
and `plots.sweep_figures` / `plots.save_figures`. Metric definitions live in one module,
`stepscope.sweep.metrics` (vLLM's, docs/methods.md#serving-metrics), checked against vLLM's own code in tests.

Artifacts in `01_macro_sweep/`:

- `levels/<level>.jsonl`: raw records of the measured requests, one per line (warm-ups in
  `levels/<level>.warmup.jsonl`; older run folders hold them here, flagged): request_id, warmup, start_s,
  end_s, chunk_times_s (perf_counter at each token-bearing chunk), input_tokens,
  output_tokens (usage), success, error, http_status. Level names: `c0004` (closed loop,
  concurrency 4), `r2.5` (open loop, 2.5 req/s Poisson).
- `levels/<level>.meta.json`: level, mode, concurrency, request_rate, n_requests,
  client_cpu_pct, server_metrics (/metrics snapshots: running, waiting, kv_cache_usage
  0-1, t_s), complete (false: the server died in it), settings (the level's identity,
  `run.level_identity`). Written last: its presence marks a finished level, which a re-run
  with --resume keeps when the identity matches.
- `levels/<level>.partial.jsonl`: the measured requests of a level in progress, appended
  as each finishes; replaced by the two files above when the level ends, so only an
  interrupted level (Ctrl-C, a killed kernel) leaves one.
- `levels.csv`: one row per level: level, mode, concurrency, request_rate, n_requests,
  n_completed, n_failed, duration_s, request_throughput_rps, output_throughput_tok_s,
  total_throughput_tok_s, total_input_tokens, total_output_tokens, output_tok_s_per_user
  (mean over requests of output tokens / E2EL), goodput_rps, goodput_tok_s, slo_met_share and
  slo_{ttft,tpot,itl,e2el}_share (under `sweep.slo`; `stepscope.sweep.goodput`),
  {ttft,tpot,itl,e2el}_ms_{mean,median,p90,p99,std,min,max} and _p<P> for each other
  `sweep.percentiles` (default p25, p75, p95),
  littles_concurrency, peak_output_tok_s_1s, bunched_chunk_share (inter-chunk gaps under
  0.05 ms), merged_token_share (output tokens that arrived in another token's chunk),
  stall_count, stall_total_s, stall_max_s, stall_share (server-wide stalls: every stream
  in flight silent at once for over `thresholds.STALL_GAP_S`; `stepscope.sweep.stalls`),
  input_tokens_{p50,p90}, output_tokens_{p50,p90}, prefix_cache_hit_rate
  (`stepscope.sweep.workloads`), gpu_sm_clock_drop_share, gpu_memory_used_share_max,
  gpu_power_w_max (NVML; `stepscope.sweep.gpu_telemetry`), client_cpu_pct, client_bound,
  server_running_max, server_waiting_max, kv_cache_usage_max (0-1), complete, source.
- `vllm_bench/<level>.vllm.json` (each level in `vllm bench serve --save-result`'s keys) and
  `requests.csv` (one row per measured request): `stepscope.sweep.exports`.
- `imported_vllm_bench.csv`: the `sweep.import_results` files in the levels.csv columns
  (only when some are listed).
- `summary.json`: knee_concurrency, plateau_output_tok_s, knee_gain, gains_per_doubling
  {C: gain}, c1_ttft_ms_median, c1_tpot_ms_median, n_levels, died_at_level,
  died_message, failures [{level, request_id, http_status, error}] (first 50),
  n_failures, flags [str], slo {bounds_ms, min_share, concurrency/rate: the SLO-boundary level}.
- `gpu_telemetry.csv` (every GPU's clocks, power, temperature, memory and utilisation about
  every 0.5 s of each level, where NVML is present) and `gpu_telemetry.json` (available, or why not).
- Figures: sweep_output_tok_s_vs_concurrency.png, sweep_latency_vs_concurrency.png,
  sweep_latency_vs_throughput.png, sweep_tok_s_per_gpu_vs_tok_s_per_user.png.
"""

_EXPORTS = {"ServerInfo": "client", "load_server": "client", "SweepResult": "run", "finish": "run",
            "run_sweep": "run", "import_vllm_results": "vllm_import"}


def __getattr__(name: str):
    # Lazy re-exports: the report draws sweep plots (`stepscope.sweep.plots`) without
    # importing the HTTP client (aiohttp and ssl, ~0.1 s) that only stage 01 needs.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"stepscope.sweep.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'stepscope.sweep' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
