"""Speculative-decoding acceptance from vLLM's cumulative `/metrics` counters, differenced around a window
(docs/campaigns.md).

Tokens per decode step = (generated − requests) / (generated − requests − accepted): each decode step emits
one token plus its accepted drafts.
"""

from __future__ import annotations

import math
import re
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stepscope.errors import StepscopeError

METRICS_SCRAPES = ("metrics.before.prom", "metrics.after.prom")
"""Stage 04's reads of /metrics, in its folder: just before /start_profile and just after
/stop_profile, so their difference counts exactly the profiled requests."""

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATED = "vllm:generation_tokens_total"
REQUESTS = "vllm:request_success_total"


def parse_prometheus(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """`{metric: {labels: value}}` from Prometheus text exposition; comments skipped."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        out.setdefault(m.group(1), {})[labels] = value
    return out


def _total(parsed: dict, name: str) -> float | None:
    series = parsed.get(name)
    return sum(series.values()) if series else None


def _per_position(parsed: dict) -> dict[int, float]:
    out: dict[int, float] = {}
    for labels, v in (parsed.get(ACCEPTED_PER_POS) or {}).items():
        pos = dict(labels).get("position")
        if pos is not None and pos.isdigit():
            out[int(pos)] = out.get(int(pos), 0.0) + v
    return out


@dataclass(frozen=True)
class SpecDecodeStats:
    """Counter differences over one window, and what follows from them."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: dict[int, float] = field(default_factory=dict)
    generated_tokens: float | None = None
    requests: float | None = None

    @property
    def speculating(self) -> bool:
        return self.drafts > 0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_verify_step(self) -> float | None:
        """Tokens a step that carried a draft emits on average: 1 + accepted / drafts."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def decode_steps(self) -> float | None:
        """Decode steps summed over requests (each request's first token comes from prefill)."""
        if self.generated_tokens is None or self.requests is None:
            return None
        return self.generated_tokens - self.requests - self.accepted_tokens

    @property
    def tokens_per_decode_step(self) -> float | None:
        """Tokens per decode step over all steps, those that drafted nothing included."""
        steps = self.decode_steps
        if not steps or steps <= 0:
            return None
        return (self.generated_tokens - self.requests) / steps

    @property
    def draft_step_share(self) -> float | None:
        """Share of decode steps that carried a draft."""
        steps = self.decode_steps
        return self.drafts / steps if steps and steps > 0 else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["accepted_per_position"] = {str(k): v for k, v in sorted(self.accepted_per_position.items())}
        for key in ("acceptance_rate", "tokens_per_verify_step", "decode_steps", "tokens_per_decode_step",
                    "draft_step_share"):
            d[key] = getattr(self, key)
        return d


def spec_decode_delta(before_text: str, after_text: str) -> SpecDecodeStats | None:
    """Counters over the window between two scrapes; None when the server has no spec decoding."""
    a, b = parse_prometheus(before_text), parse_prometheus(after_text)
    if _total(b, DRAFTS) is None:
        return None

    def diff(name: str) -> float | None:
        vb = _total(b, name)
        if vb is None:
            return None
        return vb - (_total(a, name) or 0.0)

    pa, pb = _per_position(a), _per_position(b)
    return SpecDecodeStats(
        drafts=diff(DRAFTS) or 0.0, draft_tokens=diff(DRAFT_TOKENS) or 0.0,
        accepted_tokens=diff(ACCEPTED) or 0.0,
        accepted_per_position={k: pb[k] - pa.get(k, 0.0) for k in sorted(pb)},
        generated_tokens=diff(GENERATED), requests=diff(REQUESTS))


def stats_from_json(d: dict | None) -> SpecDecodeStats | None:
    if not d:
        return None
    return SpecDecodeStats(
        drafts=float(d["drafts"]), draft_tokens=float(d["draft_tokens"]),
        accepted_tokens=float(d["accepted_tokens"]),
        accepted_per_position={int(k): float(v) for k, v in (d.get("accepted_per_position") or {}).items()},
        generated_tokens=_opt(d.get("generated_tokens")), requests=_opt(d.get("requests")))


def _opt(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def scrape(base_url: str, timeout_s: float = 10.0) -> str:
    """The server's `/metrics` text; a StepscopeError naming the URL when it cannot be read."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own server's URL
            return resp.read().decode("utf-8", "replace")
    except OSError as exc:
        raise StepscopeError(f"could not read the server's metrics: {exc}", where=url,
                             hint="vLLM serves /metrics on its API port; is the server still up?") from None


def stage_scrapes(stage_dir: Path) -> tuple[str, str] | None:
    """Stage 04's two reads of /metrics (`METRICS_SCRAPES`, before and after), or None when it
    has not both (a server whose /metrics could not be read, or an older run folder)."""
    paths = [Path(stage_dir) / name for name in METRICS_SCRAPES]
    if not all(p.is_file() for p in paths):
        return None
    before, after = (p.read_text() for p in paths)
    return before, after


def save_scrape(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- load samples

SAMPLE_SERIES: dict[str, tuple[str, ...]] = {
    # column -> the metric names that carry it (vLLM V1 first, then SGLang), summed over labels
    "requests_running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "requests_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "sglang:token_usage"),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total",),
    "iteration_tokens_count": ("vllm:iteration_tokens_total_count",),
    "iteration_tokens_sum": ("vllm:iteration_tokens_total_sum",),
    "queue_time_count": ("vllm:request_queue_time_seconds_count",),
    "queue_time_sum_s": ("vllm:request_queue_time_seconds_sum",),
    "generation_tokens_total": (GENERATED, "sglang:generation_tokens_total"),
}
"""What each row of `server_metrics.csv` reads from one scrape. `kv_cache_usage_perc` is a 0-1 fraction
despite its name; `_total`/`_count`/`_sum` columns are cumulative, so a window is a difference."""


def sample(text: str) -> dict[str, float | None]:
    """One scrape's SAMPLE_SERIES values; None for a series this server does not expose."""
    parsed = parse_prometheus(text)
    out: dict[str, float | None] = {}
    for column, names in SAMPLE_SERIES.items():
        out[column] = next((v for v in (_total(parsed, n) for n in names) if v is not None), None)
    return out


def missing_series(samples: list[dict]) -> list[str]:
    """The SAMPLE_SERIES columns no scrape had: named, never guessed (SGLang exposes no
    preemption or iteration-token counters under these names, for one)."""
    if not samples:
        return list(SAMPLE_SERIES)
    return [c for c in SAMPLE_SERIES if all(s.get(c) is None for s in samples)]


def window_tokens_per_step(first: dict, last: dict) -> float | None:
    """Tokens per engine step between two samples, from the iteration-tokens histogram."""
    try:
        steps = last["iteration_tokens_count"] - first["iteration_tokens_count"]
        tokens = last["iteration_tokens_sum"] - first["iteration_tokens_sum"]
    except (KeyError, TypeError):
        return None
    return tokens / steps if steps > 0 else None


def scrape_row(text: str, *, level: str, phase: str, t_start: float, t_end: float, t0: float,
               n_bytes: int | None = None) -> dict:
    """One `server_metrics.csv` row (schema.ServerMetricsRow) from a scrape's text and timing
    (perf_counter seconds: the scrape's start and end, and the level's first scrape)."""
    return {"level": level, "phase": phase, "t_s": t_start - t0, "scrape_ms": (t_end - t_start) * 1e3,
            "scrape_bytes": n_bytes, **sample(text)}


def samples_table(metas: list[dict]):
    """server_metrics.csv from the levels' meta files (their `server_samples`), level order kept;
    levels measured before rows were recorded contribute none."""
    import pandas as pd

    from stepscope.schema import ServerMetricsRow, columns

    cols = [*columns(ServerMetricsRow), "scrape_bytes"]
    rows = [r for m in metas for r in (m.get("server_samples") or [])]
    return pd.DataFrame(rows, columns=cols)


def samples_info(table, interval_s: float) -> dict:
    """server_metrics.json (schema.ServerMetricsInfo): the interval, what a scrape cost, and
    the series the server did not expose."""
    import math

    n = int(len(table))

    def q(col: str, p: float) -> float | None:
        v = table[col].dropna() if n and col in table else []
        return float(v.quantile(p)) if len(v) else None

    missing = missing_series(table.to_dict(orient="records")) if n else list(SAMPLE_SERIES)
    out = {"interval_s": interval_s, "n_scrapes": n, "scrape_ms_median": q("scrape_ms", 0.5),
           "scrape_ms_p90": q("scrape_ms", 0.9), "scrape_bytes_median": q("scrape_bytes", 0.5),
           "missing": missing}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
