"""Stages 02 and 03: GEMM and collective micro-benchmarks at the model's own shapes.

Stage 02 (`stepscope.micro.gemm`)
    run_stage(params, out_dir) -> GemmStage (targets, grid, table, prediction: schema.GemmPrediction,
    peak_mem_bw_gbps, peak_source, notes, device)
    building blocks: plan_targets(params), gemm_grid(targets, dtypes, planned_backends(backends), engine_dtype=),
    run_gemm_grid(grid, warmup=, repeats=, threads=, peak_bw_gbps=, csv_path=),
    build_prediction(table, targets, params) -> schema.GemmPrediction, prediction_table(pred), summary_table(table),
    plot_roofline(table, peak_bw_gbps=, peak_tflops=) -> Figure.

    02_gemm_micro/gemm.csv, one row per (model, shape, m, dtype, backend, mode):
      model, tp, gemm ("+"-joined names sharing the shape), layer_kind, m, n, k, batch
      (batched GEMM count, MLA's per-head bmm), experts, rows_per_expert (grouped routed-expert
      rows only), dtype (float32 | bfloat16 | w4a16-g32), backend (torch | marlin | vllm: the
      engine's own kernels, `stepscope.micro.vllm_cpu`), kernel (the op a trace shows),
      mode (hot | cold), device, threads, time_us_median,
      time_us_p10, time_us_p90, n_repeats, flops (2·M·N·K·batch), bytes (docs/methods.md#gemm-byte-model),
      tflops, gbps, pct_peak_bw, status (ok | skipped | failed), reason.
      A backend that cannot run (Marlin without CUDA) is one `skipped` row per model with its reason.
    02_gemm_micro/prediction.json:
      {model, tp, method, gemm_us_per_decode_step: {"<M>": us}, gemm_calls_per_decode_step: {"<M>": n},
       weight_bytes_per_decode_step: {"<M>": bytes} (weights one GPU reads per step, distinct experts),
       routed_expert_us_per_decode_step, reference_gemm_us_per_decode_step (torch), reference_config,
       missing_shapes, clamped_shapes, config: {backend, dtype, mode, routed_backend, routed_experts},
       presets: [{model, tp, gemm_us_per_decode_step, ...}], device, peak_mem_bw_gbps, peak_source,
       timing, notes}
    Figure: figures/gemm_roofline.png.

Stage 03 (`stepscope.micro.collectives`)
    run_stage(params, out_dir) -> CollectiveStage (plan, collectives, burst,
    prediction: schema.CommPrediction)
    building blocks: plan_collectives(params), run_collectives(plan, work_dir),
    collective_table(results), burst_table(results, plan), build_prediction(burst, coll, plan),
    plot_latency_vs_size(coll, burst) -> Figure; formulas busbw_factor/algbw_gbps/busbw_gbps;
    prediction_for_trace(pred, {trace name: ms}) (re-points the prediction at the implementation
    a trace ran), implementation_table(pred);
    importers parse_nccl_tests_text(text), parse_nccl_tests_json(obj), read_nccl_tests(path).

    03_nccl_burst/collectives.csv: source (stepscope | nccl-tests...), implementation (gloo | nccl |
      vllm_cpu_shm | pynccl | custom_ar), op (all_reduce | all_gather), backend (gloo | nccl | shm |
      custom), world_size, dtype, size_bytes, count, mode (eager | cuda_graph), placement,
      time_us_rank_min, time_us_rank_median, time_us_rank_max (each rank's median per-op time,
      then min/median/max across ranks; nccl-tests imports fill the median with their time),
      algbw_gbps, busbw_gbps (nccl-tests formulas), n_iters.
    03_nccl_burst/burst.csv: implementation, k, batch_m, size_bytes, total_us (median over repeats of the
      slowest rank), total_us_p10, total_us_p90, per_op_us (= total_us / k), mode
      (eager | cuda_graph), backend, world_size, n_repeats, status, reason.
    03_nccl_burst/prediction.json: {model, k, k_source, backend, world_size, dtype, method,
      comm_us_per_decode_step (= k × per_op_us, batch 1), per_op_us, size_bytes, mode,
      by_batch: {"<M>": {...}}, eager_per_op_us_same_size, burst_over_eager_per_op,
      all_gather_us, all_gather_size_bytes, implementation, implementation_reason, matches_trace,
      implementations: {"<implementation>": {the same numbers}}, interconnect, hardware, notes}
    03_nccl_burst/ranks/: raw per-rank timings (rank<R>.json), progress and logs.
    Figure: figures/collective_latency_vs_size.png.
"""
