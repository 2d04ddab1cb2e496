"""Category figures: the one implementation, used by stage 05 and by the report (stage 06).

Each function takes DataFrames and returns a pyplot-free Figure; colours come from
`stepscope.palette.color_for`, so a category looks alike everywhere.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from stepscope.palette import IDLE_COLOR, category_sort_key, color_for
from stepscope.trace.account import select_decode_steps
from stepscope.wording import WINDOW, plural, step_label
from stepscope.runfolder import FIGURE_DPI as DPI
from stepscope.runfolder import save_figure, save_figures  # noqa: F401  (the one saver; re-exported)

_STEP_MARKERS = ("_", ".", "x", "+")
_LINE_STYLES = ("--", ":", "-.", (0, (5, 1)))


def new_figure(width: float = 8.0, height: float = 4.2) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def tick_labels_overlap(ax: Axes, axis: str = "x") -> bool:
    """Whether two of an axis's tick labels overlap as drawn (laid out by the figure's engine)."""
    fig = ax.get_figure()
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    get = ax.get_xticklabels if axis == "x" else ax.get_yticklabels
    boxes = sorted((t.get_window_extent(renderer) for t in [*get(), *get(minor=True)] if t.get_visible() and t.get_text()),
                   key=lambda b: b.x0 if axis == "x" else b.y0)
    return any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))


def keep_tick_labels_apart(ax: Axes) -> None:
    """Rotate the x tick labels, then show every other one, until none overlaps another."""
    for rotation in (30, 90):
        if not tick_labels_overlap(ax):
            return
        ax.tick_params(axis="x", rotation=rotation)
        for t in ax.get_xticklabels():
            t.set_horizontalalignment("right" if rotation == 30 else "center")
    while tick_labels_overlap(ax):
        shown = [t for t in ax.get_xticklabels() if t.get_visible()]
        if len(shown) < 3:
            return
        for t in shown[1::2]:
            t.set_visible(False)



# --------------------------------------------------------------------------- stacked bars


def plot_category_bars(bars: pd.DataFrame, markers: Mapping[str, float | Sequence[float] | None] | None = None,
                       *, title: str, xlabel: str | None = None, step_label: str = "decode step") -> Figure:
    """Stacked bars of category busy time (ms), one per `label` (long-form: label, category, ms_per_step).
    `markers`: one value (a line across) or one per bar, so stacked time can be read against the step's wall
    time."""
    labels = list(dict.fromkeys(bars["label"].astype(str)))
    cats = sorted(bars["category"].astype(str).unique(), key=category_sort_key)
    n = len(labels)
    fig, ax = new_figure(min(18.0, max(8.5, 0.12 * n + 5.0)), 4.6)
    x = np.arange(n)
    bottom = np.zeros(n)
    label_col = bars["label"].astype(str)
    for cat in cats:
        sub = bars[bars["category"].astype(str) == cat].groupby(label_col)["ms_per_step"].sum()
        vals = np.array([float(sub.get(lbl, 0.0)) for lbl in labels])
        ax.bar(x, vals, bottom=bottom, color=color_for(cat), label=cat, width=0.8,
               edgecolor="white", linewidth=0.4 if n <= 40 else 0)
        bottom += vals
    for i, (name, value) in enumerate((markers or {}).items()):
        if value is None:
            continue
        if np.ndim(value) == 0:
            if np.isfinite(float(value)):
                ax.axhline(float(value), color="black", linestyle=_LINE_STYLES[i % len(_LINE_STYLES)],
                           linewidth=1.2, label=f"{name}: {float(value):.3g} ms")
        else:
            ax.plot(x, np.asarray(value, dtype=float), linestyle="none", color="black",
                    marker=_STEP_MARKERS[i % len(_STEP_MARKERS)], markersize=10 if n <= 40 else 6,
                    markeredgewidth=1.5, label=name)
    every = max(1, int(np.ceil(n / 40)))  # at most ~40 tick labels, however many steps
    # A few bars named "c=16, batch 13 (n=1)" read best on two lines, upright.
    ax.set_xticks(x[::every], [lbl.replace(", ", "\n") if n <= 12 else lbl for lbl in labels[::every]])
    if n > 12:
        ax.tick_params(axis="x", rotation=90, labelsize=7)
    ax.set_xlim(-0.6, n - 0.4)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(f"ms per {step_label} (each category's busy time)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    keep_tick_labels_apart(ax)
    return fig


def plot_decode_category_time_stacked(bars: pd.DataFrame, markers: Mapping[str, float | None] | None = None,
                                      n_steps: int | None = None, step_label: str = "decode step") -> Figure:
    """Mean category time per step, one bar per `label`, with whole-step readings (union, span, TPOT ms) as
    lines."""
    steps = f", mean over {n_steps:g} {plural(step_label, n_steps)}" if n_steps else ""
    return plot_category_bars(bars, markers, step_label=step_label,
                              title=f"Category time per {step_label}{steps}\n"
                              "(bars: per-category busy time, stacked; lines: whole-step readings)")


def decode_step_bars(step_categories: pd.DataFrame, steps: pd.DataFrame, rank: int = 0,
                     step_label: str = "decode step") -> tuple[pd.DataFrame, dict[str, np.ndarray], str]:
    """Long-form bars of one rank's judged steps (`select_decode_steps`): category union per step, each step's
    span and sum (ms), and the steps' plural name."""
    dec, _ = select_decode_steps(steps[steps["rank"] == rank])
    which = plural(step_label, len(dec))
    sc = step_categories[(step_categories["rank"] == rank) & step_categories["step_id"].isin(dec["step_id"])]
    grid = pd.MultiIndex.from_product([dec["step_id"], sorted(sc["category"].unique())],
                                      names=["step_id", "category"])
    union = sc.groupby(["step_id", "category"])["union_us"].sum().reindex(grid, fill_value=0.0)
    bars = union.reset_index()
    bars = pd.DataFrame({"label": bars["step_id"].astype(str), "category": bars["category"],
                         "ms_per_step": bars["union_us"] / 1e3})
    marks = {"work span (first to last event)": dec["span_us"].to_numpy() / 1e3,
             "kernel/op sum": dec["kernel_sum_us"].to_numpy() / 1e3}
    return bars, marks, which


def plot_decode_steps(step_categories: pd.DataFrame, steps: pd.DataFrame, rank: int = 0,
                      step_label: str = "decode step") -> Figure:
    """One stacked bar per judged step of one rank: each category's busy time, with the step's
    work span and kernel/op sum marked; shows how steps vary, where the mean bars cannot."""
    bars, marks, which = decode_step_bars(step_categories, steps, rank, step_label)
    n = bars["label"].nunique()
    return plot_category_bars(bars, marks, xlabel="step id", step_label=step_label, title=(
        f"Rank {rank}: category time in each of {n} {which}\n"
        "(bars: category busy time, stacked; marks: step span, kernel/op sum)"))



# --------------------------------------------------------------------------- distributions


def step_category_matrix(bars: pd.DataFrame) -> pd.DataFrame:
    """Category x step table of busy ms (rows in palette order, columns in step order) from
    `decode_step_bars`' long form; a category absent from a step is 0 ms there."""
    if bars.empty:
        return pd.DataFrame(dtype=float)
    m = bars.pivot_table(index="category", columns="label", values="ms_per_step", aggfunc="sum",
                         fill_value=0.0, sort=False)
    m = m[list(dict.fromkeys(bars["label"].astype(str)))]
    return m.loc[sorted(m.index, key=category_sort_key)]


STRIP_JITTER_SEED = 0


def plot_step_category_distribution(bars: pd.DataFrame, *, which: str = "decode steps") -> Figure:
    """Per-step busy ms of each category across steps: a box (quartiles, whiskers at 1.5 IQR)
    with every step drawn as a point, so a bimodal category or a few slow steps show."""
    import seaborn as sns

    order = sorted(bars["category"].astype(str).unique(), key=category_sort_key)
    n_steps = bars["label"].nunique()
    fig, ax = new_figure(max(7.0, 0.55 * len(order) + 3.0), 4.4)
    palette = {c: color_for(c) for c in order}
    kw = dict(data=bars, x="category", y="ms_per_step", order=order, hue="category", hue_order=order,
              palette=palette, legend=False, ax=ax)
    with warnings.catch_warnings():
        # seaborn 0.13 still passes `vert=` to matplotlib's bxp, deprecated since matplotlib 3.11
        warnings.filterwarnings("ignore", message=".*vert: bool", category=DeprecationWarning)
        sns.boxplot(**kw, showfliers=False, width=0.6, boxprops={"alpha": 0.45})
    # seaborn jitters with numpy's global generator: seed it for this call only, so the same
    # trace draws the same figure (byte-identical PNGs between runs) and callers' state is kept.
    state = np.random.get_state()
    try:
        np.random.seed(STRIP_JITTER_SEED)
        sns.stripplot(**kw, size=2.5, jitter=0.25, edgecolor="black", linewidth=0.2)
    finally:
        np.random.set_state(state)
    ax.set_xlabel("")
    ax.set_ylabel("ms per step (category busy time, union)")
    ax.tick_params(axis="x", rotation=45, labelsize=8)
    ax.set_title(f"Per-step time by category across {n_steps} {which}\n"
                 "(box: quartiles, whiskers 1.5 IQR; dots: one per step)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return fig


HEATMAP_MAX_WIDTH_IN = 10.0
"""At the figures' DPI, about the report page's width (1,100 px), so the page shows it unshrunk."""
HEATMAP_FONT_PT = 9


def plot_step_category_heatmap(matrix: pd.DataFrame, *, which: str = "decode steps") -> Figure:
    """Category busy ms in every step (colour), rows = categories, columns = steps in order:
    warm-up steps and outliers stand out as columns unlike their neighbours."""
    import seaborn as sns

    n_steps = matrix.shape[1]
    # At most HEATMAP_MAX_WIDTH_IN wide: a wider figure is shrunk to the page, and its text with it
    # (18 in at 155 steps read as 5 px text in the report).
    fig, ax = new_figure(min(HEATMAP_MAX_WIDTH_IN, max(7.0, 0.08 * n_steps + 4.0)), max(3.0, 0.32 * len(matrix) + 1.6))
    sns.heatmap(matrix, ax=ax, cmap="rocket_r", xticklabels=max(1, int(np.ceil(n_steps / 20))),
                cbar_kws={"label": "ms per step (busy time)"})
    ax.set_xlabel("step id")
    ax.set_ylabel("")
    ax.tick_params(axis="both", labelsize=HEATMAP_FONT_PT)
    keep_tick_labels_apart(ax)
    ax.set_title(f"Category time in each of {n_steps} {which} (ms, union of each category's work)",
                 fontsize=10)
    return fig


# --------------------------------------------------------------------------- timeline


def plot_decode_step_timeline(timeline: pd.DataFrame, title_note: str = "",
                              highlight: str | None = None, lane: str = "stream",
                              step_label: str = "decode step") -> Figure:
    """One decode step on one rank: a lane per stream (or thread), events coloured by category, times from the
    step's start; `highlight` greys out every other category."""
    what = "ops" if lane == "thread" else "device events"
    idle = "no op running" if lane == "thread" else "no device work"
    if timeline.empty:
        fig, ax = new_figure(10.0, 2.2)
        ax.text(0.5, 0.5, f"no {step_label} to draw", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    df = timeline.copy()
    df["start_us"] = df["start_us"].astype(float)
    df["dur_us"] = df["dur_us"].astype(float)
    df["start_us"] -= float(df["start_us"].min())
    streams = sorted(df["stream"].astype(str).unique(), key=lambda s: (len(s), s))
    fig, ax = new_figure(10.0, max(2.2, 0.55 * len(streams) + 1.6))
    ax.set_facecolor(IDLE_COLOR)
    for row, stream in enumerate(streams):
        sub = df[df["stream"].astype(str) == stream]
        for cat, grp in sub.groupby("category"):
            color = color_for(str(cat)) if highlight in (None, str(cat)) else "#e6e6e6"
            ax.broken_barh(list(zip(grp["start_us"], grp["dur_us"])), (row - 0.4, 0.8),
                           facecolors=color, edgecolor="none")
    ax.set_yticks(range(len(streams)), [f"{lane} {s}" for s in streams])
    ax.set_ylim(-0.6, len(streams) - 0.4)
    ax.invert_yaxis()
    end_us = float((df["start_us"] + df["dur_us"]).max())
    ax.set_xlim(0, end_us * 1.01 if end_us > 0 else 1)
    ax.set_xlabel(f"µs since the step's first {what.removesuffix('s')}")
    cats = sorted(df["category"].astype(str).unique(), key=category_sort_key)
    if highlight is not None:
        cats = [c for c in cats if c == highlight]
    ax.legend(handles=[Patch(color=color_for(c), label=c) for c in cats], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    where = ""
    if "rank" in df and df["rank"].nunique() == 1:
        where = f", rank {df['rank'].iloc[0]}"
    note = f" {title_note}" if title_note else ""
    ax.set_title(f"Timeline of one {step_label}{where}: {len(df)} {what} on {len(streams)} "
                 f"{lane}(s), {end_us:.0f} µs span{note}\n(white = {idle})")
    ax.grid(axis="x", alpha=0.3)
    return fig


# --------------------------------------------------------------------------- per-category summaries


def plot_category_shares(decode: pd.DataFrame, n_steps: int | None = None,
                         step_label: str = "decode step") -> Figure:
    """Horizontal bars: each category's share of a step (%), largest on top."""
    df = decode.copy()
    df["share_pct"] = 100.0 * df["share_of_step"].astype(float)
    df = df.sort_values("share_pct")
    fig, ax = new_figure(8.0, max(2.5, 0.32 * len(df) + 1.2))
    ax.barh(df["category"], df["share_pct"], color=[color_for(c) for c in df["category"]])
    for y, (v, ms) in enumerate(zip(df["share_pct"], df["ms_per_step_mean"])):
        ax.text(v, y, f" {v:.1f} % ({ms:.3g} ms)", va="center", fontsize=8)
    ax.set_xlabel(f"share of the {step_label} (%)")
    steps = f"{n_steps:g} {plural(step_label, n_steps)}, " if n_steps else ""
    ratio = ("ms in the window / window time" if step_label == WINDOW else "mean ms per step / step time")
    ax.set_title(f"Category shares of a {step_label}\n({steps}{ratio})")
    ax.set_xlim(0, max(5.0, float(df["share_pct"].max()) * 1.3))
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_amdahl_ceiling(amdahl: pd.DataFrame, step_label: str = "decode step") -> Figure:
    """Horizontal bars of the Amdahl ceiling per category (× faster if its exposed time were 0)."""
    df = amdahl[np.isfinite(amdahl["speedup_ceiling"].astype(float))].sort_values("speedup_ceiling")
    fig, ax = new_figure(8.0, max(2.5, 0.32 * len(df) + 1.2))
    ax.barh(df["category"], df["speedup_ceiling"] - 1.0, left=1.0,
            color=[color_for(c) for c in df["category"]])
    for y, v in enumerate(df["speedup_ceiling"]):
        ax.text(v, y, f" {v:.2f}×", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"{step_label} speed-up if the category's exposed time were removed (×)")
    ax.set_title("Amdahl ceiling per category (step time / (step time − exposed time))")
    ax.set_xlim(1.0, max(1.1, float(df["speedup_ceiling"].max()) * 1.08) if len(df) else 2.0)
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_cross_rank(cross_rank: pd.DataFrame, top: int = 12, step_label: str = "decode step") -> Figure:
    """Per category (the `top` first rows): min, median and max across ranks of the decode
    busy ms per step. A collective's min-rank time approximates the transfer; the rest waits."""
    d = cross_rank.head(top)
    fig, ax = new_figure(8.5, max(2.5, 0.38 * len(d) + 1.4))
    yy = np.arange(len(d))[::-1]
    colors = [color_for(c) for c in d["category"]]
    ax.hlines(yy, d["ms_per_step_min"], d["ms_per_step_max"], colors=colors, linewidth=3, alpha=0.6)
    ax.scatter(d["ms_per_step_min"], yy, marker="|", s=160, color="black", label="min over ranks", zorder=3)
    ax.scatter(d["ms_per_step_max"], yy, marker="|", s=160, color="dimgray", linewidths=1, zorder=3,
               label="max over ranks")
    ax.scatter(d["ms_per_step_median"], yy, marker="o", s=40, c=colors, edgecolors="black", linewidths=0.6,
               zorder=4)
    # the median dots take their category's colour, so the legend shows a neutral one
    ax.scatter([], [], marker="o", s=40, color="white", edgecolors="black", linewidths=0.6, label="median over ranks")
    ax.set_yticks(yy, d["category"])
    ax.set_xlabel(f"busy ms per {step_label} (interval union), across ranks")
    n = int(d["n_ranks"].max()) if len(d) else 0
    ax.set_title(f"Category time across {n} ranks (min / median / max)\n"
                 "a collective's min-rank time approximates the transfer; the rest is waiting")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_module_time(modules: pd.DataFrame, top: int = 15, step_label: str = "decode step") -> Figure:
    """Horizontal bars of the module paths with the most own device work (ms per step), coloured by their
    largest category, from modules.csv."""
    from stepscope.trace.modules import leaf_modules

    d = leaf_modules(modules, top).iloc[::-1]
    fig, ax = new_figure(9.0, max(2.5, 0.34 * len(d) + 1.4))
    # the last two path parts name the module (`Qwen2MLP/Linear#2`), the rest is its place
    labels = d["path"].str.split("/").str[-2:].str.join("/")
    ax.barh(labels, d["self_ms_per_step"], color=[color_for(c) for c in d["top_category"].fillna("other")])
    total = d["sum_ms_per_step"] / d["share_of_device"].where(d["share_of_device"] > 0)
    for y, (v, t) in enumerate(zip(d["self_ms_per_step"], total)):
        pct = f", {100 * v / t:.1f} %" if t and np.isfinite(t) else ""
        ax.text(v, y, f" {v:.3g} ms{pct}", va="center", fontsize=8)
    n = int(d["n_steps"].max()) if len(d) else 0
    ax.set_xlabel(f"device ms per {step_label} launched with the module innermost (summed kernel durations)")
    ax.set_title(f"Time by module: the {len(d)} paths with the most work of their own\n"
                 f"({n} {plural(step_label, n)}; all instances of a path summed; colour = its largest category)")
    ax.set_xlim(0, max(0.01, float(d["self_ms_per_step"].max()) * 1.35) if len(d) else 1.0)
    ax.grid(axis="x", alpha=0.3)
    return fig


# --------------------------------------------------------------------------- stage 05


def stage_figures(an) -> dict[str, Figure]:
    """Stage 05's figures by file name (without extension): the reference rank's steps and
    its median-span decode step, and the cross-rank spread when there are several ranks."""
    ref = an.reference
    info = an.summary.trace_info
    label = step_label(info.kind if info is not None else None)
    lane = "thread" if ref.mode == "cpu" else "stream"
    note = ""
    if not an.timeline.empty and "step_id" in an.timeline:
        note = f"(step {int(an.timeline['step_id'].iloc[0])}, the median span)"
    figs = {
        f"05_step_categories_rank{ref.rank}": plot_decode_steps(ref.step_categories, an.steps, ref.rank,
                                                                       label),
        f"05_step_timeline_rank{ref.rank}": plot_decode_step_timeline(an.timeline, title_note=note, lane=lane,
                                                                      step_label=label),
    }
    bars, _, which = decode_step_bars(ref.step_categories, an.steps, ref.rank, label)
    if bars["label"].nunique() > 1:
        figs[f"05_step_categories_distribution_rank{ref.rank}"] = \
            plot_step_category_distribution(bars, which=which)
        figs[f"05_step_categories_heatmap_rank{ref.rank}"] = \
            plot_step_category_heatmap(step_category_matrix(bars), which=which)
    if len(an.ranks) > 1 and not an.cross_rank.empty:
        figs["05_cross_rank_categories"] = plot_cross_rank(an.cross_rank, step_label=label)
    if not ref.modules.empty:
        figs[f"05_module_time_rank{ref.rank}"] = plot_module_time(ref.modules, step_label=label)
    return figs


