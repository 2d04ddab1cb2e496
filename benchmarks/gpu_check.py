"""Helper of `benchmarks/gpu_check.sh`: device facts, the GPU parts of stages 02 and 03,
and the markdown summary. Each subcommand writes its result under OUT before it exits.

    python benchmarks/gpu_check.py device OUT
    python benchmarks/gpu_check.py gemm OUT       # stage 02 on the GPU: Kimi-K2.5 TP=8 shapes
    python benchmarks/gpu_check.py nccl OUT       # stage 03 with NCCL across every GPU present
    python benchmarks/gpu_check.py summary OUT    # OUT/summary.md from whatever is there
"""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

KIMI_PARAMS = "params/kimi-k25-int4-tp8-pcie.yaml"
GEMM_M = [1, 16, 128]


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    tmp.replace(path)


def cmd_device(out: Path) -> int:
    import torch

    info: dict = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available(), "device_count": 0, "devices": []}
    if info["cuda_available"]:
        from stepscope.micro.timing import peak_mem_bw_gbps

        info["device_count"] = torch.cuda.device_count()
        for i in range(info["device_count"]):
            p = torch.cuda.get_device_properties(i)
            info["devices"].append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                                    "capability": f"{p.major}.{p.minor}",
                                    "l2_mb": round(getattr(p, "L2_cache_size", 0) / 1e6, 1)})
        # The same lookup stage 02 makes, so the device line and the GEMM table agree.
        info["peak_mem_bw_gbps"], info["peak_source"] = peak_mem_bw_gbps(None, "cuda")
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        info["vllm"] = f"not importable: {type(exc).__name__}"
    from stepscope.micro import marlin

    info["marlin"] = marlin.availability() or "available"
    _write_json(out / "device.json", info)
    print(json.dumps(info, indent=2))
    return 0 if info["cuda_available"] else 3


def _params(n_gpus: int, name: str):
    from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict

    over = {
        # The box's own peak from stepscope.hardware, not the RTX PRO 6000's in the file.
        "hardware": {"name": name, "gpu_count": n_gpus, "peak_mem_bw_gbps": None},
        "micro": {"gemm": {"m_values": GEMM_M, "warmup": 5, "repeats": 20, "presets": []},
                  "collectives": {"backend": "nccl", "world_size": n_gpus, "iters": 50, "burst_repeats": 20,
                                  "timeout_s": 120}},
    }
    return params_from_dict(deep_merge(params_to_dict(load_params(KIMI_PARAMS)), over))


def _device() -> tuple[int, str]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    return torch.cuda.device_count(), torch.cuda.get_device_name(0)


def cmd_gemm(out: Path) -> int:
    from stepscope.micro import gemm

    n, name = _device()
    t0 = time.perf_counter()
    res = gemm.run_stage(_params(n, name), out / "02_gemm_micro", progress=False)
    t = res.table
    _write_json(out / "02_gemm_micro" / "check.json", {
        "wall_s": time.perf_counter() - t0, "rows": len(t), "status": t["status"].value_counts().to_dict(),
        "peak_mem_bw_gbps": res.peak_mem_bw_gbps, "peak_source": res.peak_source})
    return 0 if (t["status"] != "failed").all() else 1


def cmd_nccl(out: Path) -> int:
    from stepscope.micro import collectives

    n, name = _device()
    t0 = time.perf_counter()
    res = collectives.run_stage(_params(n, name), out / "03_nccl_burst", progress=False)
    b = res.burst
    _write_json(out / "03_nccl_burst" / "check.json", {
        "wall_s": time.perf_counter() - t0, "world_size": n,
        "burst_status": b["status"].value_counts().to_dict() if len(b) else {},
        "notes": res.prediction.notes})
    return 0 if (b["status"] != "failed").all() else 1


# --------------------------------------------------------------------------- summary


def _steps(out: Path) -> list[tuple[str, str, str]]:
    rows = []
    p = out / "steps.tsv"
    if p.is_file():
        for line in p.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                rows.append((parts[0], parts[1], parts[2]))
    return rows


def _rc_text(rc: str) -> str:
    return {"0": "pass", "124": "FAIL (timed out)", "137": "FAIL (killed after timeout)",
            "3": "skipped (no CUDA device)"}.get(rc, f"FAIL (exit {rc})")


def _pytest_rows(out: Path) -> list[str]:
    p = out / "pytest.xml"
    if not p.is_file():
        return ["| pytest | no result | pytest.xml missing (see pytest.log) |"]
    rows, skipped = [], {}
    for case in ET.parse(p).getroot().iter("testcase"):
        test = f"{Path(case.get('file') or case.get('classname', '')).name}::{case.get('name')}"
        secs = float(case.get("time") or 0)
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            msg = (bad.get("message") or "").splitlines()[0][:160] if bad.get("message") else "see pytest.log"
            rows.append(f"| `{test}` | **FAIL** | {msg.replace('|', '/')} |")
        elif skip is not None:
            reason = (skip.get("message") or "").replace("|", "/")[:160]
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            rows.append(f"| `{test}` | pass | {secs:.1f} s |")
    rows += [f"| {n} test(s) | skipped | {r} |" for r, n in skipped.items()]
    return rows


def _gemm_section(out: Path) -> list[str]:
    import pandas as pd

    p = out / "02_gemm_micro" / "gemm.csv"
    if not p.is_file():
        return ["No GEMM table (stage 02 did not run or wrote nothing)."]
    t = pd.read_csv(p)
    ok = t[t["status"] == "ok"]
    model = ", ".join(f"{m} TP={tp}" for m, tp in ok[["model", "tp"]].drop_duplicates().itertuples(index=False))
    lines = [f"| GEMM ({model}) | backend | M | hot µs | cold µs | cold GB/s | cold % of peak |",
             "|---|---|---|---|---|---|---|"]
    for (g, be, m), s in ok.groupby(["gemm", "backend", "m"], sort=False):
        if m not in (min(GEMM_M), max(GEMM_M)):
            continue
        hot = s[s["mode"] == "hot"]["time_us_median"]
        cold = s[s["mode"] == "cold"]
        lines.append(f"| {g} | {be} | {int(m)} | {hot.iloc[0]:.1f} | "
                     + (f"{cold['time_us_median'].iloc[0]:.1f} | {cold['gbps'].iloc[0]:.0f} | "
                        f"{cold['pct_peak_bw'].iloc[0]:.0f} % |" if len(cold) else "- | - | - |"))
    other = t[t["status"] != "ok"]
    lines += [f"\n{r.backend} {r.gemm}: {r.status}: {r.reason}" for r in other.itertuples()][:5]
    lines.append(f"\n{len(ok)} rows measured (median of 20 replays of a CUDA graph of 50 calls; cold rotates "
                 f"weights through more than 2x L2); full table: `02_gemm_micro/gemm.csv`.")
    return lines


def _nccl_section(out: Path) -> list[str]:
    import pandas as pd

    d = out / "03_nccl_burst"
    if not (d / "burst.csv").is_file():
        return ["No collective tables (stage 03 did not run or wrote nothing)."]
    pred = json.loads((d / "prediction.json").read_text()) if (d / "prediction.json").is_file() else {}
    b = pd.read_csv(d / "burst.csv")
    c = pd.read_csv(d / "collectives.csv")
    lines = [f"World size {pred.get('world_size')}, {pred.get('backend')}."
             + "".join(f" {n}." for n in pred.get("notes") or [])]
    for r in b.itertuples():
        if r.status == "ok":
            lines.append(f"- burst of K={int(r.k)} all-reduces of {int(r.size_bytes)} B ({r.mode}): "
                         f"{r.per_op_us:.1f} µs per op, {r.total_us:.0f} µs in all")
        else:
            lines.append(f"- burst ({r.mode}): {r.status}: {r.reason}")
    big = c[c["op"] == "all_reduce"].sort_values("size_bytes").tail(1)
    for r in big.itertuples():
        lines.append(f"- eager all-reduce of {int(r.size_bytes)} B: {r.time_us_rank_median:.1f} µs, "
                     f"busbw {r.busbw_gbps:.1f} GB/s (nccl-tests formula)")
    return lines


def cmd_summary(out: Path) -> int:
    dev = json.loads((out / "device.json").read_text()) if (out / "device.json").is_file() else {}
    steps = _steps(out)
    devices = dev.get("devices") or []
    lines = [f"# stepscope GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    if devices:
        lines.append(f"Device: {len(devices)} x {devices[0]['name']} ({devices[0]['memory_gib']} GiB, "
                     f"sm {devices[0]['capability']}, L2 {devices[0]['l2_mb']} MB); torch {dev.get('torch')} "
                     f"(CUDA {dev.get('torch_cuda')}); vLLM {dev.get('vllm')}; Marlin: {dev.get('marlin')}.")
        peak = dev.get("peak_mem_bw_gbps")
        lines.append(f"Peak memory bandwidth: {f'{peak:.0f} GB/s' if peak else 'unknown'} "
                     f"({dev.get('peak_source')}).")
    else:
        lines.append("**No CUDA device: nothing GPU-specific was checked.** "
                     f"torch {dev.get('torch', '?')} (CUDA build: {dev.get('torch_cuda') or 'none'}).")
    lines += ["", "## Steps", "", "| step | result | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {_rc_text(rc)} | {secs} |" for name, rc, secs in steps]
    lines += ["", "## Tests", "", "| test | result | detail |", "|---|---|---|"] + _pytest_rows(out)
    lines += ["", "## Stage 02 on the GPU: GEMM timings", ""] + _gemm_section(out)
    lines += ["", "## Stage 03 on the GPU: NCCL", ""] + _nccl_section(out)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    import signal

    # The outer `timeout` sends SIGTERM: exit through Python so that `finally` blocks run
    # (run_collectives stops its rank processes there instead of leaving them on the GPUs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if len(argv) != 2 or argv[0] not in ("device", "gemm", "nccl", "summary"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    return {"device": cmd_device, "gemm": cmd_gemm, "nccl": cmd_nccl, "summary": cmd_summary}[argv[0]](out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
