"""Corpus traces that stepscope must refuse, each with the reason it gives (issue 35, class 7).

`tests/data/corpus/<name>.json.gz` files with no facts file: there is nothing to describe, so
the only fact is the refusal and its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.errors import TraceError
from stepscope.trace import analyze_traces

CORPUS = Path(__file__).parent / "data" / "corpus"


def test_a_libkineto_unit_tests_output_is_refused(tmp_path: Path):
    # libkineto's CuptiActivityProfilerTest writes one 0.02 µs kernel beside four 0.02-0.04 µs ops
    # (pytorch/kineto docs/traces/before_fix_trace.json); a verdict on it once read "busy 100 %"
    with pytest.raises(TraceError, match=r"too little to analyse: 1 work event\(s\) \(0.02 µs\)"):
        analyze_traces([CORPUS / "kineto-libkineto-unit-test-one-kernel.json.gz"], tmp_path / "05_categorize",
                       progress=False, perfetto=False)
