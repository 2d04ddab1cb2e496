"""Write the small workload samples shipped in params/workloads/ (nothing is downloaded).

    .venv/bin/python benchmarks/make_workload_samples.py

sharegpt_sample.json: 24 made-up conversations in the ShareGPT layout, prompts of a few to
~60 words and replies of a few to ~80, so a tiny model's 512-token context holds them.
mooncake_sample.jsonl: 40 requests over ~20 s in the Mooncake trace layout, with bursts,
and hash_ids drawn so that about half the requests share their first blocks with an
earlier one (16-token blocks: set sweep.workload.hash_block_tokens: 16 for it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "params" / "workloads"
WORDS = ("kernel trace decode step latency batch cache prefix token engine server request "
         "matrix attention memory bandwidth clock stream queue profile sample").split()


def _text(rng: np.random.Generator, n_words: int) -> str:
    return " ".join(rng.choice(WORDS, size=n_words)).capitalize() + "."


def sharegpt(rng: np.random.Generator) -> list[dict]:
    out = []
    for i in range(24):
        turns = [{"from": "human", "value": _text(rng, int(rng.integers(4, 60)))},
                 {"from": "gpt", "value": _text(rng, int(rng.integers(4, 80)))}]
        if i % 5 == 0:  # a later turn, which the loader ignores
            turns += [{"from": "human", "value": _text(rng, 6)}, {"from": "gpt", "value": _text(rng, 6)}]
        out.append({"id": f"sample-{i:02d}", "conversations": turns})
    return out


def mooncake(rng: np.random.Generator) -> list[dict]:
    rows, t_ms, next_id, prefixes = [], 0.0, 0, []
    for i in range(40):
        t_ms += float(rng.exponential(150.0 if i % 8 < 3 else 700.0))  # bursts, then lulls
        n_in = int(rng.integers(24, 160))
        n_blocks = -(-n_in // 16)
        shared = prefixes[int(rng.integers(len(prefixes)))] if prefixes and rng.random() < 0.5 else []
        ids = list(shared[:n_blocks])
        while len(ids) < n_blocks:
            ids.append(next_id)
            next_id += 1
        prefixes.append(ids[:3])
        rows.append({"timestamp": round(t_ms), "input_length": n_in,
                     "output_length": int(rng.integers(8, 64)), "hash_ids": ids})
    return rows


if __name__ == "__main__":
    rng = np.random.default_rng(25)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sharegpt_sample.json").write_text(json.dumps(sharegpt(rng), indent=1) + "\n")
    (OUT / "mooncake_sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mooncake(rng)))
