"""Figures only the report draws: the speculative-decoding what-if (the others are their stage's)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # reports are rendered headless; never grab a display

from stepscope.trace.plots import save_figure  # noqa: E402,F401  (compare saves with it)
from stepscope.trace.plots import new_figure as _new  # noqa: E402

import pandas as pd  # noqa: E402
from stepscope.wording import fmt_num  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


# --------------------------------------------------------------------------- what-if


def plot_speculative_whatif(whatif: pd.DataFrame, measured_tpot_ms: float) -> Figure:
    """Projected TPOT against acceptance length, one line per draft cost (per drafted token)."""
    fig, ax = _new(7.5, 4.0)
    for frac, grp in whatif.groupby("draft_cost_fraction"):
        grp = grp.sort_values("acceptance_length")
        ax.plot(grp["acceptance_length"], grp["tpot_ms_projected"], "o-",
                label=f"draft {100 * frac:g} % of a step per drafted token")
    ax.axhline(measured_tpot_ms, color="black", linestyle="--",
               label=f"measured: {fmt_num(measured_tpot_ms)} ms")
    ax.set_xlabel("mean acceptance length (tokens emitted per verify step)")
    ax.set_ylabel("projected TPOT (ms)")
    ax.set_title("What-if: speculative decoding, projected from the measured step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig
