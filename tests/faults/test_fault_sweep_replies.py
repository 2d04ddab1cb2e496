"""The sweep survives any reply (issue 39, findings 6 and 7): a chunk that is not a JSON
object, an impossible usage count, bytes that never make an SSE event, or an error page that
never ends fail their own request, with the reason, counted in its level; the levels finished before it
and the level it is in reach levels.csv and summary.json. The server is the fake of
`stepscope.testing.fake_server`, misbehaving on purpose."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from stepscope.config import SweepParams
from stepscope.errors import ServerError
from stepscope.sweep.client import MAX_SSE_EVENT_BYTES, READ_BUFSIZE, ServerInfo
from stepscope.sweep.run import run_sweep
from stepscope.testing.fake_server import FakeBehaviour, FakeServer

PARAMS = SweepParams(concurrency=(1, 2), input_len=4, output_len=4, min_requests=4, warmup_requests=0,
                     silence_timeout_s=1.0, request_timeout_s=5.0)
"""c0001: 4 requests (the fake's 1st to 4th), c0002: 8 requests (its 5th to 12th)."""

REASONS = {
    "list_event": r"bad reply: an SSE event is JSON but not an object: \[1,2,3\]",
    "usage_many": r"bad reply: usage\.completion_tokens is 'many', not a whole number",
    "usage_huge": r"bad reply: usage\.completion_tokens is 1000000000000, outside the 0 to 20 this request "
                  r"allows \(max_tokens 4 \+ 16\)",
    "endless_bytes": r"bad reply: (?P<n>\d+) bytes arrived with no SSE event end \(a blank line\): over the "
                     rf"{MAX_SSE_EVENT_BYTES} bytes one event may hold",
    # an HTML error page that never ends: its start is kept, no more of it is read
    "endless_error_page": r"HTTP 500 Internal Server Error: <p>x{497}",
    "trickle_bytes": r"bad reply: no complete SSE event for 1\.\d s while bytes kept arriving \(\d+ bytes without "
                     r"an event end; silence timeout 1 s\)",
}


def _server(fake: FakeServer) -> ServerInfo:
    return ServerInfo(base_url=fake.base_url, served_model="fake", tp=2)


@pytest.mark.parametrize("mode", sorted(REASONS))
def test_a_hostile_reply_fails_its_request_and_every_level_is_written(tmp_path, mode):
    # the first level is clean; every second request of the second one gets the hostile reply
    with FakeServer(FakeBehaviour(bad_reply=mode, bad_reply_after=4, bad_reply_every=2)) as fake:
        res = run_sweep(_server(fake), PARAMS, tmp_path)
    levels = pd.read_csv(tmp_path / "levels.csv")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert levels["level"].tolist() == ["c0001", "c0002"]
    assert levels["n_completed"].tolist() == [4, 4] and levels["n_failed"].tolist() == [0, 4]
    # only the good requests' tokens count: 4 requests of 4 tokens in the level's duration
    c2 = levels.iloc[1]
    assert c2["output_throughput_tok_s"] * c2["duration_s"] == pytest.approx(16)
    assert summary["n_failures"] == 4 and "level c0002: 4 of 8 requests failed" in summary["flags"]
    for failure in summary["failures"]:
        assert failure["level"] == "c0002" and isinstance(failure["request_id"], int)
        assert re.fullmatch(REASONS[mode], failure["error"]), failure["error"]
    res.raise_if_died()  # the level finished: nothing to stop the stage for
    if mode == "endless_bytes":  # the buffer stopped at the cap, not at the server's whim
        n = int(re.fullmatch(REASONS[mode], summary["failures"][0]["error"])["n"])
        assert n <= MAX_SSE_EVENT_BYTES + READ_BUFSIZE


def test_a_sweep_whose_every_reply_is_hostile_fails_with_the_reason(tmp_path):
    with FakeServer(FakeBehaviour(bad_reply="list_event")) as fake:
        res = run_sweep(_server(fake), PARAMS, tmp_path)
    assert (tmp_path / "levels.csv").is_file() and (tmp_path / "summary.json").is_file()
    assert res.levels["n_failed"].tolist() == [4, 8]
    with pytest.raises(ServerError) as exc:
        res.raise_if_died()
    assert ("every request of the sweep failed; the first error: bad reply: an SSE event is JSON but not an "
            "object: [1,2,3]") in str(exc.value)
