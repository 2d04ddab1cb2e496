"""A campaign's own files (`CAMPAIGN_ARTIFACTS`), written by `stepscope.campaign.run`."""

from __future__ import annotations

from stepscope.schema._base import Record


class CampaignRun(Record, kw_only=True):
    key: str
    """`<variant>#<repeat>`, e.g. `tp2-ngram#1`."""
    variant: str
    repeat: int
    """1 to `repeats`; the runs are interleaved by repeat."""
    run_dir: str
    """The run folder, relative to the campaign folder (`<variant>/` or `<variant>/repeat-<k>/`)."""
    description: str | None = None
    """The variant's description from the params."""
    status: str = "pending"
    """`pending` (not started), `ok` or `failed` (see `exit_code`)."""
    wall_s: float | None = None
    """Wall time of the run's stages, seconds, summed over resumes."""
    exit_code: int | None = None
    """The run's exit code (`stepscope.runner`: 0 ok, 1 a stage failed, 130 interrupted)."""
    reused: dict[str, str] = {}
    """{stage id: key of the run its artifacts were copied from}: the inputs were the same."""
    measured: dict[str, str] = {}
    """{stage id: fingerprint of the inputs the stage was measured with}: what a later run with the
    same fingerprint reuses instead of measuring again."""


class CampaignRecord(Record, kw_only=True):
    """The campaign's plan and the state of every run, rewritten after every change."""

    campaign_id: str
    """The campaign folder's name."""
    baseline: str
    """The variant the others are measured against."""
    variants: list[str]
    """Every variant, the baseline first."""
    repeats: int = 1
    """Runs per variant."""
    created_at: str | None = None
    """ISO 8601, UTC."""
    updated_at: str | None = None
    params_file: str | None = None
    """The campaign params YAML it was started from."""
    wall_s: float = 0.0
    """Wall time of the whole campaign, seconds, summed over resumes."""
    runs: list[CampaignRun] = []
    """Every planned run, in the order they run."""


class ReusedFrom(Record, kw_only=True):
    """A stage folder copied from another run of the campaign instead of measured again."""

    run: str
    """The key of the run it was copied from."""
    path: str
    """That run's folder."""


class SpecDecodeCounters(Record, kw_only=True):
    """Differences of the server's cumulative counters between two scrapes of /metrics."""

    drafts: float
    """Verify steps that carried drafted tokens."""
    draft_tokens: float
    """Tokens proposed by the drafter."""
    accepted_tokens: float
    """Drafted tokens the target model accepted."""
    accepted_per_position: dict[str, float] = {}
    """{draft position (0 first): tokens accepted at it}."""
    generated_tokens: float | None = None
    """Output tokens generated over the window."""
    requests: float | None = None
    """Requests finished over the window."""
    acceptance_rate: float | None = None
    """accepted_tokens / draft_tokens."""
    tokens_per_verify_step: float | None = None
    """1 + accepted_tokens / drafts: tokens a verify step yields."""
    decode_steps: float | None = None
    """Decode steps summed over requests (each request's first token comes from prefill)."""
    tokens_per_decode_step: float | None = None
    """Tokens per decode step over all steps, those that drafted nothing included."""
    draft_step_share: float | None = None
    """Share of decode steps that carried a draft."""


class SpecDecodeWindow(Record, kw_only=True):
    stage: str
    """The stage the scrapes were taken around."""
    spec_decode: SpecDecodeCounters | None = None
    """None when the server has no speculative-decoding counters or /metrics could not be read."""
    note: str | None = None
    """Why `spec_decode` is None."""
    window: str | None = None
    """What the counters span: `profiled requests` (stage 04's own scrapes, just inside
    /start_profile and /stop_profile: the trace's requests) or `whole stage` (warm-up
    included). Absent in campaign folders written before it was recorded."""
