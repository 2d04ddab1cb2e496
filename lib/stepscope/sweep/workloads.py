"""Request sources beyond random prompts of one length: ShareGPT-style conversations, a Mooncake-style timed
trace, and a shared-prefix workload (docs/workloads.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import msgspec
import numpy as np

from stepscope.errors import ParamsError
from stepscope.sweep import client as cl
from stepscope.sweep.arrivals import scaled_trace_offsets_s

WORKLOAD_MODES = ("sharegpt", "mooncake", "shared_prefix")

WORKLOAD_COLUMNS = ["input_tokens_p50", "input_tokens_p90", "output_tokens_p50", "output_tokens_p90",
                    "prefix_cache_hit_rate"]
"""levels.csv columns this module fills: the completed requests' token counts (from usage)
and the share of prompt tokens the server's prefix cache served during the level."""

_HUMAN, _REPLY = ("human", "user"), ("gpt", "assistant", "chatgpt", "bard", "model")


def _bad(path: str | Path, what: str, fix: str) -> ParamsError:
    return ParamsError(f"{path}: {what}. {fix} (formats: docs/workloads.md)")


def load_sharegpt(path: str | Path) -> list[tuple[str, str]]:
    """(first human turn, the reply after it) of each conversation in a ShareGPT-style JSON
    list; conversations without both are skipped, as vLLM's ShareGPT loader does."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise _bad(path, f"cannot read a JSON file ({exc})", "point sweep.workload.path at a ShareGPT JSON list") from None
    if not isinstance(data, list):
        raise _bad(path, "is not a JSON list of conversations", "the top level must be [{\"conversations\": [...]}, ...]")
    out = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            continue
        for first, second in zip(turns, turns[1:]):
            if str(first.get("from")).lower() in _HUMAN and str(second.get("from")).lower() in _REPLY:
                out.append((str(first.get("value", "")), str(second.get("value", ""))))
                break
    if not out:
        raise _bad(path, "holds no conversation with a human turn followed by a reply",
                   "each entry needs conversations [{from: human, value: ...}, {from: gpt, value: ...}]")
    return out


def load_mooncake(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a Mooncake-style JSONL trace: timestamp (ms), input_length, output_length,
    hash_ids (optional), in timestamp order."""
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise _bad(path, f"cannot be read ({exc})", "point sweep.workload.path at a JSONL trace") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            rows.append({"timestamp_ms": float(d.get("timestamp", 0)), "input_length": int(d["input_length"]),
                         "output_length": int(d["output_length"]), "hash_ids": [int(h) for h in d.get("hash_ids") or []]})
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise _bad(f"{path}:{i}", f"is not a trace row ({type(exc).__name__}: {exc})",
                       "each line needs timestamp, input_length, output_length and optionally hash_ids") from None
    if not rows:
        raise _bad(path, "has no rows", "one JSON object per line")
    return sorted(rows, key=lambda r: r["timestamp_ms"])


def block_tokens(pool: np.ndarray, hash_id: int, n: int) -> list[int]:
    """The n tokens one prefix-hash id stands for: the same id always gives the same block,
    so requests that share ids share a prefix the server's cache can serve."""
    return np.random.default_rng([hash_id, 0x5EED]).choice(pool, size=n).tolist()


def mooncake_prompt(row: dict[str, Any], pool: np.ndarray, block: int, rng: np.random.Generator) -> list[int]:
    """A token-ID prompt of exactly `input_length` tokens: one block per hash id, then
    request-own tokens for any length the ids do not cover."""
    ids: list[int] = []
    for h in row["hash_ids"]:
        if len(ids) >= row["input_length"]:
            break
        ids += block_tokens(pool, h, block)
    ids = ids[: row["input_length"]]
    return ids + rng.choice(pool, size=row["input_length"] - len(ids)).tolist()


class WorkloadSource:
    """Payloads for one level from `params.workload`, cycling through the file when needed: `payloads(n)`,
    `next_payload()`, `offsets_s(level)` (None: the sweep's own arrivals)."""

    def __init__(self, params: Any, pool: Sequence[int], model: str, seed: int = 0, tokenizer=None):
        self.p, self.w, self.model = params, params.workload, model
        self.pool, self.rng, self.i = np.asarray(pool), np.random.default_rng(seed), 0
        self.items = self._items(tokenizer)

    def _items(self, tokenizer) -> list[tuple[Any, int]]:
        w, p = self.w, self.p
        fixed = w.output_len_from == "fixed"
        if p.prompt_mode == "sharegpt":
            if tokenizer is None:
                raise ParamsError("prompt_mode sharegpt needs the model's tokenizer here (to count the reply "
                                  "and the prompt): make the model folder readable, or use a mooncake trace")
            items = []
            for prompt, reply in load_sharegpt(w.path):
                n_in = len(tokenizer.encode(prompt))
                if w.max_input_len and n_in > w.max_input_len:
                    continue
                items.append((prompt, p.output_len if fixed else max(1, len(tokenizer.encode(reply, add_special_tokens=False)))))
            if not items:
                raise _bad(w.path, f"has no prompt within max_input_len {w.max_input_len}", "raise sweep.workload.max_input_len")
            return items
        if p.prompt_mode == "mooncake":
            self.rows = [r for r in load_mooncake(w.path) if not w.max_input_len or r["input_length"] <= w.max_input_len]
            return [(mooncake_prompt(r, self.pool, w.hash_block_tokens, self.rng),
                     p.output_len if fixed else max(1, r["output_length"])) for r in self.rows]
        # shared_prefix: prefix k of num_prefixes, then a suffix of its own for each request
        prefixes = [block_tokens(self.pool, k, w.prefix_len) for k in range(w.num_prefixes)]
        n = max(64, 4 * w.num_prefixes)
        return [(prefixes[i % w.num_prefixes] + self.rng.choice(self.pool, size=p.input_len - w.prefix_len).tolist(),
                 p.output_len) for i in range(n)]

    def next_payload(self) -> dict[str, Any]:
        prompt, out = self.items[self.i % len(self.items)]
        if self.p.prompt_mode == "shared_prefix" and self.i >= len(self.items):
            # past the first pass every suffix is new, so a request never repeats whole
            prompt = prompt[: self.w.prefix_len] + self.rng.choice(self.pool, size=len(prompt) - self.w.prefix_len).tolist()
        self.i += 1
        return cl.completion_payload(self.model, prompt, out)

    def payloads(self, n: int) -> list[dict[str, Any]]:
        return [self.next_payload() for _ in range(n)]

    def offsets_s(self, n_warm: int, n: int, rate_rps: float | None) -> np.ndarray | None:
        """Send times of the n measured requests when a trace is replayed: its timestamps
        (cycled) from the first measured one, scaled to `rate_rps` when given."""
        if self.p.prompt_mode != "mooncake" or not self.w.replay:
            return None
        t = np.array([r["timestamp_ms"] for r in self.rows]) / 1e3
        span = (t.max() - t.min()) + (t.max() - t.min()) / max(len(t) - 1, 1)
        idx = np.arange(n_warm, n_warm + n)
        cycled = t[idx % len(t)] + span * (idx // len(t))
        return scaled_trace_offsets_s(cycled, rate_rps)


def prefix_cache_hit_rate(samples: list[dict[str, Any]]) -> float:
    """Prompt tokens served from the prefix cache / looked up, from vLLM's /metrics counters differenced over
    the level; NaN without them."""
    rows = [s for s in samples if s.get("prefix_cache_queries_total") is not None]
    if len(rows) < 2:
        return math.nan
    queries = rows[-1]["prefix_cache_queries_total"] - rows[0]["prefix_cache_queries_total"]
    hits = rows[-1]["prefix_cache_hits_total"] - rows[0]["prefix_cache_hits_total"]
    return float(hits / queries) if queries > 0 else math.nan


def workload_columns(meta: dict[str, Any], done_input: np.ndarray, done_output: np.ndarray) -> dict[str, float]:
    """The WORKLOAD_COLUMNS of one level from its completed requests' token counts and meta."""
    def q(v: np.ndarray, p: float) -> float:
        return float(np.percentile(v, p)) if len(v) else math.nan

    return {"input_tokens_p50": q(done_input, 50), "input_tokens_p90": q(done_input, 90),
            "output_tokens_p50": q(done_output, 50), "output_tokens_p90": q(done_output, 90),
            "prefix_cache_hit_rate": prefix_cache_hit_rate(meta.get("server_samples") or [])}


class RandomSource:
    """The random sources (`token_ids`, `random_text`) behind WorkloadSource's interface."""

    def __init__(self, params: Any, pool: Sequence[int], model: str, seed: int = 0, tokenizer=None):
        self.prompts = cl.PromptSource(params.prompt_mode, pool, params.input_len, seed=seed, tokenizer=tokenizer)
        self.model, self.output_len = model, params.output_len

    def next_payload(self) -> dict[str, Any]:
        return cl.completion_payload(self.model, self.prompts.next(), self.output_len)

    def payloads(self, n: int) -> list[dict[str, Any]]:
        return [self.next_payload() for _ in range(n)]

    def offsets_s(self, n_warm: int, n: int, rate_rps: float | None) -> None:
        return None


def make_source(params: Any, pool: Sequence[int], model: str, seed: int = 0, tokenizer=None):
    """The request source `params.prompt_mode` names (SweepParams)."""
    cls = WorkloadSource if params.prompt_mode in WORKLOAD_MODES else RandomSource
    return cls(params, pool, model, seed=seed, tokenizer=tokenizer)


def level_offsets_s(level: Any, params: Any, source: Any, n_warm: int, n: int, seed: int) -> np.ndarray | None:
    """Send times of an open-loop level's n measured requests when they are not the sweep's
    gamma arrivals at one rate: a ramp level (vLLM's ramp-up), or a replayed trace."""
    from stepscope.sweep.arrivals import arrival_offsets_s, ramp_rates

    if level.mode == "ramp":
        r = params.ramp
        return arrival_offsets_s(n, ramp_rates(n, r.strategy, r.start_rps, r.end_rps),
                                 burstiness=params.burstiness, seed=seed)
    return source.offsets_s(n_warm, n, level.request_rate)


def load_shape_identity(params: Any) -> dict[str, Any]:
    """The arrival and workload settings that change what a level measures, for its identity;
    only those set away from their defaults, so levels measured before these keys still match."""
    out: dict[str, Any] = {}
    if params.burstiness != 1.0:
        out["burstiness"] = params.burstiness
    if params.ramp is not None:
        out["ramp"] = msgspec.structs.asdict(params.ramp)
    if params.prompt_mode in WORKLOAD_MODES:
        out["workload"] = msgspec.structs.asdict(params.workload)
    return out
