"""Fuzzing stage 05's input: random truncations, byte flips and JSON mutations of the real
traces in tests/data/traces. Whatever the damage, no traceback escapes: every file ends
either analysed or flagged (a TraceError naming it), never as an unexpected exception."""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path


from stepscope.errors import TraceError
from stepscope.trace.analyze import analyze_traces

SOURCES = ("vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "hta-cpu-only.json.gz",
           "sglang-mi300x-qwen3-8b-decode.json.gz", "vllm-mi300x-gptoss-decode-fullgraph.json.gz")
N_PER_KIND = 4
SEED = 1313


def _truncate_gz(raw: bytes, doc: dict, rng: random.Random) -> bytes:
    return raw[: rng.randrange(1, len(raw))]


def _truncate_json(raw: bytes, doc: dict, rng: random.Random) -> bytes:
    text = gzip.decompress(raw)
    return gzip.compress(text[: rng.randrange(1, len(text))])


def _flip_json_bytes(raw: bytes, doc: dict, rng: random.Random) -> bytes:
    text = bytearray(gzip.decompress(raw))
    for _ in range(rng.randint(1, 20)):
        text[rng.randrange(len(text))] = rng.randrange(256)
    return gzip.compress(bytes(text))


def _flip_gz_bytes(raw: bytes, doc: dict, rng: random.Random) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 5)):
        data[rng.randrange(10, len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


BAD_VALUES = (None, "x", -1, -1e18, 1e300, [], {}, True, "", 0)


def _mutate_json(raw: bytes, doc: dict, rng: random.Random) -> bytes:
    """Structurally valid JSON with wrong values: keys dropped, types swapped, sections replaced."""
    doc = copy.deepcopy(doc)
    events = doc.get("traceEvents") or []
    for _ in range(rng.randint(1, 40)):
        roll = rng.random()
        if events and roll < 0.45:
            ev = rng.choice(events)
            if isinstance(ev, dict) and ev:
                key = rng.choice(list(ev))
                if rng.random() < 0.4:
                    del ev[key]
                else:
                    ev[key] = rng.choice(BAD_VALUES)
        elif events and roll < 0.6:
            events[rng.randrange(len(events))] = rng.choice(BAD_VALUES)
        elif events and roll < 0.7:
            rng.shuffle(events)
        elif roll < 0.8:
            doc[rng.choice(["distributedInfo", "deviceProperties", "traceEvents", "schemaVersion"])] = \
                rng.choice(BAD_VALUES)
            events = doc.get("traceEvents") if isinstance(doc.get("traceEvents"), list) else []
        elif events and roll < 0.9:
            ev = rng.choice(events)
            if isinstance(ev, dict):
                ev["args"] = rng.choice(BAD_VALUES + ({"correlation": "x", "External id": None},))
        else:
            doc.pop(rng.choice(list(doc) or ["x"]), None)
            events = doc.get("traceEvents") if isinstance(doc.get("traceEvents"), list) else []
    return gzip.compress(json.dumps(doc).encode())


MUTATIONS = {"truncate_gz": _truncate_gz, "truncate_json": _truncate_json, "flip_json_bytes": _flip_json_bytes,
             "flip_gz_bytes": _flip_gz_bytes, "mutate_json": _mutate_json}


def _mutants(real_traces: Path, folder: Path) -> list[tuple[str, Path]]:
    rng = random.Random(SEED)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for src in SOURCES:
        raw = (real_traces / src).read_bytes()
        doc = json.loads(gzip.decompress(raw))
        for kind, mutate in MUTATIONS.items():
            for i in range(N_PER_KIND):
                path = folder / f"{kind}-{i}-{src}"
                path.write_bytes(mutate(raw, doc, rng))
                out.append((f"{kind} #{i} of {src}", path))
    return out


def test_damaged_traces_end_analysed_or_flagged(real_traces, tmp_path):
    mutants = _mutants(real_traces, tmp_path / "in")
    escaped, outcomes = [], {"analysed": 0, "flagged": 0}
    for label, path in mutants:
        out = tmp_path / "out" / path.name
        try:
            an = analyze_traces([path], out, progress=False, perfetto=False, cache_dir=tmp_path / "cache")
        except TraceError as exc:
            # Flagged: the message names the file (or the flags that name it) and a fix.
            assert path.name in str(exc), f"{label}: the error does not name the file: {exc}"
            outcomes["flagged"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - the point of the test
            import traceback

            escaped.append(f"{label}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
            continue
        named = [r for r in an.ranks if Path(r.file).name == path.name]
        flagged = [f for f in an.flags if path.name in f.message]
        assert named or flagged, f"{label}: neither analysed nor flagged"
        outcomes["analysed" if named else "flagged"] += 1
    assert not escaped, f"{len(escaped)} of {len(mutants)} damaged traces raised a traceback:\n" + \
        "\n\n".join(escaped[:5])
    assert outcomes["analysed"] + outcomes["flagged"] == len(mutants) == 80
    # The mutations must bite: most truncations and byte flips cannot still be analysed.
    assert outcomes["flagged"] >= 30, outcomes
