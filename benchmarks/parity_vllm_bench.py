"""Does stepscope's sweep read what vLLM's own benchmark reads, on the same server?

    flock /tmp/stepscope-vllm.lock .venv/bin/python benchmarks/parity_vllm_bench.py \
        [--concurrency 4 16] [--rounds 3] [--requests-per-stream 8]

One real vLLM CPU server (the tiny model of params/smoke.yaml, TP=2) serves both tools. At
each concurrency C, in alternating order round by round, vLLM's benchmark (through
`vllm.benchmarks.serve`, because the `vllm bench` console script fails on the CPU build
with PackageNotFoundError) and stepscope's sweep each send 8 x C requests, configured
alike: text prompts of exact token length from vLLM's random dataset (stepscope's
`sweep.prompt_mode: random_text`), the same input and output lengths, ignore_eos,
temperature 0, one warm-up wave of C requests; before round 1, one unrecorded vLLM pass per
concurrency warms the server. A round in which either tool fails (a failed request) is left
out for both and listed. Printed per metric: the median of each
tool over rounds with its run-to-run spread ((max - min) / median), the ratio stepscope /
vLLM, and whether the ratio is within the larger spread (the target for every metric).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

METRICS = (("output tok/s", "output_throughput_tok_s", "output_throughput"),
           ("request/s", "request_throughput_rps", "request_throughput"),
           ("TTFT median ms", "ttft_ms_median", "median_ttft_ms"),
           ("TPOT median ms", "tpot_ms_median", "median_tpot_ms"),
           ("ITL median ms", "itl_ms_median", "median_itl_ms"),
           ("E2EL median ms", "e2el_ms_median", "median_e2el_ms"),
           ("goodput req/s", "goodput_rps", "request_goodput"))
"""stepscope's levels.csv column and vLLM's result key for each quantity compared. Goodput is
counted under the same SLO on both sides (`--goodput-tpot-ms`: vLLM `--goodput tpot:X`,
stepscope `sweep.slo.tpot_ms`)."""


def launch_server(work: Path, port: int):
    from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict
    from stepscope.paths import REPO_ROOT
    from stepscope.serve import create_tiny_model, launch, tiny_model_exists
    from stepscope.serve.launch import resolve_model_path

    base = params_to_dict(load_params(REPO_ROOT / "params" / "smoke.yaml"))
    params = params_from_dict(deep_merge(base, {"server": {
        "port": port, "max_model_len": 512, "profiler": {"enabled": False},
        "extra_args": ["--block-size", "32", "--max-num-seqs", "32"]}}))
    model = resolve_model_path(params)
    if not tiny_model_exists(model):
        create_tiny_model(model, params.model.tiny)
    proc, handle = launch(params, work / "run", progress=False)
    return proc, handle, model


def stepscope_round(server, work: Path, c: int, n: int, in_len: int, out_len: int, seed: int,
                    tpot_ms: float = 50.0) -> dict:
    from stepscope.config import SloParams, SweepParams
    from stepscope.sweep import run_sweep

    sp = SweepParams(concurrency=(c,), input_len=in_len, output_len=out_len, min_requests=n,
                     warmup_requests=c, prompt_mode="random_text", slo=SloParams(tpot_ms=tpot_ms))
    res = run_sweep(server, sp, work / f"stepscope-c{c}-s{seed}", resume=False, seed=seed)
    row = res.levels.iloc[0]
    assert int(row["n_completed"]) == n, res.failures.head()
    return {key: float(row[key]) for _, key, _ in METRICS}


def vllm_round(base_url: str, served: str, model: Path, c: int, n: int, in_len: int, out_len: int,
               seed: int, tpot_ms: float = 50.0) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", served, "--tokenizer", str(model), "--dataset-name", "random",
        "--random-input-len", str(in_len), "--random-output-len", str(out_len),
        "--num-prompts", str(n), "--max-concurrency", str(c), "--num-warmups", str(c),
        "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--goodput", f"tpot:{tpot_ms:g}"])
    out = main(args)
    assert int(out["completed"]) == n, out.get("errors")
    return {key: float(out[vkey]) for _, key, vkey in METRICS}


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else float("nan")


def table(results: dict, concs: list[int]) -> tuple[str, int, int]:
    lines = ["| C | metric | stepscope median [min-max] | vLLM bench median [min-max] | stepscope / vLLM "
             "| spread (larger) | within spread |", "|---|---|---|---|---|---|---|"]
    n_in = n_all = 0
    for c in concs:
        for label, key, _ in METRICS:
            s = [r[key] for r in results[("stepscope", c)]]
            v = [r[key] for r in results[("vllm", c)]]
            ratio = statistics.median(s) / statistics.median(v) if statistics.median(v) else float("nan")
            sp = max(spread(s), spread(v))
            ok = abs(ratio - 1.0) <= sp
            n_in += ok
            n_all += 1
            lines.append(f"| {c} | {label} | {statistics.median(s):.2f} [{min(s):.2f}-{max(s):.2f}] | "
                         f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}] | {ratio:.3f} | "
                         f"{sp:.1%} | {'yes' if ok else 'NO'} |")
    return "\n".join(lines), n_in, n_all


def main_cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests-per-stream", type=int, default=8, help="requests per level = this x C")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--goodput-tpot-ms", type=float, default=50.0, help="the TPOT bound both tools count goodput under")
    a = ap.parse_args(argv)
    if not a.port:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            a.port = s.getsockname()[1]
    from stepscope.sweep import load_server

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stepscope-parity-") as tmp:
        work = Path(tmp)
        proc, handle, model = launch_server(work, a.port)
        results: dict = {}
        dropped: list[str] = []
        try:
            server = load_server(work / "run")

            def one(tool: str, c: int, n: int, seed: int) -> dict:
                if tool == "stepscope":
                    return stepscope_round(server, work, c, n, a.input_len, a.output_len, seed=seed,
                                           tpot_ms=a.goodput_tpot_ms)
                return vllm_round(handle.base_url, handle.served_model, model, c, n, a.input_len, a.output_len,
                                  seed=seed, tpot_ms=a.goodput_tpot_ms)

            # The server's first batches at each size compile and warm caches: one unrecorded pass
            # per concurrency, so round 1 does not measure start-up for whichever tool goes first.
            for c in a.concurrency:
                one("vllm", c, c, seed=10_000)
            for r in range(a.rounds):
                for c in a.concurrency:
                    order = ("stepscope", "vllm") if r % 2 == 0 else ("vllm", "stepscope")
                    pair = {}
                    try:
                        for tool in order:
                            pair[tool] = one(tool, c, a.requests_per_stream * c, seed=r)
                            print(f"round {r + 1}/{a.rounds} C={c} {tool}: "
                                  + ", ".join(f"{k}={v:.2f}" for k, v in pair[tool].items()),
                                  file=sys.stderr, flush=True)
                    except Exception as exc:  # noqa: BLE001 - a failed round is reported and left out, in pairs
                        dropped.append(f"round {r + 1} C={c}: {type(exc).__name__}: {exc}"[:200])
                        print(f"DROPPED {dropped[-1]}", file=sys.stderr, flush=True)
                        continue
                    for tool, res in pair.items():
                        results.setdefault((tool, c), []).append(res)
        finally:
            proc.stop()
    if dropped:
        print(f"\n{len(dropped)} round(s) left out, both tools' results of each:\n  " + "\n  ".join(dropped))
    if not all(results.get((t, c)) for t in ("stepscope", "vllm") for c in a.concurrency):
        print("no complete round at some concurrency: nothing to compare")
        return 1
    text, n_in, n_all = table(results, a.concurrency)
    print(f"\nparity with vllm bench serve (vllm.benchmarks.serve), one server, {a.rounds} alternating rounds, "
          f"{a.requests_per_stream} x C requests, input {a.input_len} / output {a.output_len} tokens, "
          f"random-dataset text prompts, temperature 0, ignore_eos ({time.monotonic() - t0:.0f} s)\n")
    print(text)
    print(f"\n{n_in} of {n_all} ratios within the run-to-run spread (target: all)")
    return 0 if n_in == n_all else 1


if __name__ == "__main__":
    sys.exit(main_cli())
