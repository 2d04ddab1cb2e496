"""Campaigns: a baseline and variants, each a full run, compared against the baseline's predictions.

Public API:

- `run_campaign(params_file, ...)`: `stepscope campaign`; every variant (and repeat) a full
  run into `outputs/<campaign-id>/<variant>/`, stages with unchanged inputs reused.
- `plan_campaign(raw, params, dir)`: the runs, their order and folders (pure).
- `build_campaign_report(campaign_dir)`: `campaign_report.md` and `.html`.
- `spec_decode_delta(before, after)`: acceptance from two `/metrics` scrapes.
- `regressions(run_a, run_b)`: the regression gate behind `stepscope compare --fail-on-regression`.

Files and their meaning: `stepscope.campaign.run` (folder layout), docs/campaigns.md (method).
"""

from stepscope.server_metrics import SpecDecodeStats, parse_prometheus, spec_decode_delta
from stepscope.campaign.plan import CampaignPlan, PlannedRun, plan_campaign

__all__ = ["CampaignPlan", "PlannedRun", "SpecDecodeStats", "parse_prometheus", "plan_campaign",
           "spec_decode_delta", "run_campaign", "build_campaign_report", "regressions"]


def __getattr__(name):  # heavy modules (pandas, matplotlib) load on first use
    if name == "run_campaign":
        from stepscope.campaign.run import run_campaign
        return run_campaign
    if name == "build_campaign_report":
        from stepscope.campaign.report import build_campaign_report
        return build_campaign_report
    if name == "regressions":
        from stepscope.campaign.gate import regressions
        return regressions
    raise AttributeError(name)
