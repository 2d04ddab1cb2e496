"""The test data stays publishable: every file is described, and none carries a secret."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

# Hugging Face, OpenAI-style and GitHub tokens, and AWS access key ids: the secrets a
# capture's recorded environment is most likely to hold.
TOKEN_PATTERN = re.compile(rb"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}")


def _data_files(real_traces: Path) -> list[Path]:
    return sorted(p for p in real_traces.iterdir() if p.name != "README.md")


def test_every_trace_file_has_a_provenance_row(real_traces: Path):
    readme = (real_traces / "README.md").read_text()
    names = set(re.findall(r"`([^`]+\.(?:json\.gz|txt))`", readme))
    for p in _data_files(real_traces):
        stem = re.sub(r"rank[01]", "rank{0,1}", p.name)
        assert p.name in names or stem in names, f"{p.name} has no row in tests/data/traces/README.md"


def test_no_data_file_holds_a_token(real_traces: Path):
    for p in _data_files(real_traces):
        data = gzip.open(p).read() if p.suffix == ".gz" else p.read_bytes()
        assert not TOKEN_PATTERN.search(data), f"{p.name} holds a token-like value"


def test_the_token_pattern_finds_a_hugging_face_token():
    assert TOKEN_PATTERN.search(b'"HF_TOKEN": "hf_' + b"a1B2" * 8 + b'"')
    assert not TOKEN_PATTERN.search(b'"HF_TOKEN": "<redacted>"')
