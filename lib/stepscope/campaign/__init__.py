"""Campaigns: a baseline and variants, each a full run, compared against the baseline's predictions.

`run_campaign` (`stepscope campaign`), `plan_campaign` (pure), `build_campaign_report`,
`spec_decode_delta` and `regressions` (`stepscope compare --fail-on-regression`); the method is
in docs/campaigns.md.
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
