"""Every threshold that turns a number into a flag or a judgement, in one place.

One threshold per flag: the stage that raises a flag and the report that explains it
read the same constant here, so they cannot disagree about where the line is.
"""

from __future__ import annotations

# --- stage 05 data-quality flags -------------------------------------------------------
OTHER_SHARE_LIMIT = 0.005
"""Kernel time that no category rule matched, above this share of the kernel sum: add rules."""
TEXT_TABLE_DIFF_LIMIT = 0.01
"""The profiler's text table and the trace disagree by more than this relative difference."""
BAD_EVENT_SHARE_LIMIT = 0.01
"""Work events with no usable ts or dur are dropped and flagged up to this share of a rank's; above it the
trace is damaged, not ragged, and the rank is refused."""

# --- verdict ----------------------------------------------------------------------------
LAUNCH_BOUND_IDLE_SHARE = 0.30
"""Device idle above this share of the step: the step waits on the host to launch work."""
DEVICE_BOUND_IDLE_SHARE = 0.10
"""Device idle below this share of the step: the device is the bottleneck."""
COMM_EXPOSED_SHARE = 0.80
"""Exposed/summed communication above this: it runs with nothing to hide behind."""
COMM_HIDDEN_SHARE = 0.30
"""Exposed/summed communication below this: other work hides most of it."""
OVERLAP_RATIO = 1.15
"""Kernel sum / union above this: overlap makes summed kernel time overstate the step."""
TPOT_GAP_SHARE = 0.10
"""|TPOT - step time| above this share of TPOT is flagged and explained (stage 05 and the report)."""
BETWEEN_STEPS_SHARE = 0.10
"""Time between steps (period minus span) above this share of the period is a lever of its own."""
PREDICTION_TOLERANCE = 0.25
"""Trace and micro-benchmark agree when their ratio is within 1 ± this."""

# --- guards: the invariants a verdict rests on (report.guards) ---------------------------
GUARD_TOLERANCE_REL = 0.01
"""A share above 100 % or busy above the period by more than this relative margin breaks its
invariant; within it, rounding of per-step means (each step's own reading is exact)."""
STEADY_STATE_MAX_X = 50.0
"""An Amdahl ceiling above this (one lever holding over 98 % of the step) says the trace is no
steady state of repeated steps (a capture, a warm-up, one stall), not a lever worth 50x."""
STEADY_STATE_MAX_STALL_SHARE = 0.5
"""One gap inside a judged step longer than this share of the step says the step is mostly one
host stall, not a steady state, whatever ceiling removing it gives (SGLang decode: one 463 ms gap
in a 474 ms step, 45.3x, under STEADY_STATE_MAX_X)."""
LEVER_GRAB_BAG_MIN_NAMES = 40
"""A category of at least this many distinct kernel names can be a grab-bag ..."""
LEVER_DOMINANT_SHARE = 0.5
"""... and is one when its largest kernels (up to 3, as the report shows them) hold less than
this share of its summed time: no one piece of work a fix could name."""
LEVER_TOP_KERNELS = 3
"""How many of a category's largest kernels the coherence test adds up."""
HEADLINE_IDLE_SHARE = 0.5
"""The headline's dominant-cost sentence adds the device's idle share when it idles more than
this share of the step: the largest category is then not where most of the step goes (an MI250
training step whose largest category is 0.486 % of it, idle 98.4 %)."""
LEVER_MIN_X = 1.05
"""A biggest lever whose Amdahl ceiling is under this buys under 5 % of the step: the headline
says no lever is worth naming rather than call it the biggest (a training step that idles 98 %
in a host stall, whose largest category would make it 1.00x faster)."""

# --- trace analysis ---------------------------------------------------------------------
LOW_CONFIDENCE_STEPS = 5
"""Fewer steps than this of the kind a trace is judged on: its per-step figures are flagged
low-confidence (one step says nothing about step-to-step spread)."""
MACRO_GAP_US = 1000.0
"""A gap in a step's device work at least this long is macro idle (a stall: a blocking copy,
a host-side pause); shorter gaps are micro idle (launch and dependency gaps between kernels)."""
CLOCK_SKEW_LIMIT_US = 5000.0
"""Ranks whose matched collectives end further apart than this (median) have clocks that
disagree: cross-rank arrival skews are then not trusted."""
HOST_BOUND_MICRO_IDLE_SHARE = 0.15
"""Micro idle (short gaps between kernels inside a step) above this share of the step: the
device waits on launches, so the step is host-bound. Idle in one long gap does not count."""
STALL_GAP_SHARE = 0.5
"""One gap holding more than this share of a step's idle is a stall to name, not a host-bound step
(unless the device idles most of the step: HOST_GAP_IDLE_SHARE)."""
HOST_GAP_IDLE_SHARE = 0.5
"""Device idle above this share of the step, with one gap per step holding most of it
(STALL_GAP_SHARE): the step is host-bound, by the host frame running during that gap, not a
busy step with one stall (vLLM V1 decode on an MI300X: 61 % idle, 93 % of it in one 22-28 ms gap
per step while the host ran the model's Python forward)."""
GAP_FRAME_COVER_SHARE = 0.5
"""A host frame covering at least this share of a macro gap is what the host was doing during
it; the innermost such frame names the stall's cause (a DataLoader's `__next__` covered 99.6 %
of each of OWLv2's 122-126 ms gaps, starting 0.1 ms after the last copy)."""
HOST_AHEAD_LAUNCH_DELAY_US = 50.0
"""Median launch-to-start delay above this: kernels queue behind each other, so the host runs
ahead of the device and gaps between kernels are not launch gaps."""

READINGS_AGREE_REL = 0.05
"""Two readings of one time (a rank's matched collectives, wait + completion after the last
arrival, against its collective categories in the accounting) agree within this relative
difference; beyond it they are shown side by side and flagged."""

GRAPH_REPLAY_MIN_SHARE = 0.5
"""The judged steps replay a graph when at least this share of their device events were
launched by graph launches (`cudaGraphLaunch`, `hipGraphLaunch`): most of the step then costs
one launch, so "use CUDA graphs" is no lever for it."""

STEP_SOURCE_PIECES_RATIO = 4.0
"""A step source with at least this many times the steps of another, whose steps wholly enclose most of its
own, is refused: its steps are pieces of a step (piecewise CUDA graphs)."""
DEGENERATE_MIN_WORK_EVENTS = 2
"""A rank with fewer work events than this is refused: one event has no gap, no overlap and no
step beside it to say anything of (a libkineto unit test's output: 1 kernel of 0.02 µs read as
"device busy 100 %")."""
DEGENERATE_MIN_WORK_US = 1.0
"""A rank whose work sums to less than this many µs is refused: below a single kernel launch's
own cost, too little device time to describe (the smallest real trace in the corpus, an SGLang
graph capture, runs 2 kernels for 11 µs)."""

# --- comparing runs (compare, campaign, the regression gate) ----------------------------

CHANGE_NOISE_REL = 0.05
"""A single reading with no spread of its own (one sweep level, one capture TPOT) changes
only beyond this relative difference: above the few-percent run-to-run scatter of a serving
benchmark."""

NOISE_BAND_SIGMAS = 2.0
"""A difference of two means is real beyond this many standard errors of the difference
(about 95 % for normal scatter); standard errors from repeats or from step-to-step spread."""


# --- stage 01 (serving sweep) -----------------------------------------------------------
STALL_GAP_S = 0.5
"""Every stream in flight silent at once for longer than this is a server-wide stall; a level
with one is flagged. Decode steps take milliseconds to tens of milliseconds, so half a second
of silence is a pause of the server, not a slow step."""

STALLED_LEVEL_SHARE = 0.05
"""A sweep level that lost more than this share of its time to server-wide stalls reads low: its plateau is
stated with the share, and campaigns do not compare it. Below it, stalls are within CHANGE_NOISE_REL."""

BUNCHED_GAP_MS = 0.05
"""Inter-chunk gaps below this arrived together, in one read, rather than one decode step apart."""

BUNCHED_FLAG_SHARE = 0.5
"""Flag a level when more than this share of its inter-chunk gaps are bunched; the report then
never quotes that level's TPOT as decode time."""

BUNCHED_TTFT_SHARE = 0.5
"""A batch-1 capture whose median TTFT exceeds this share of its median end-to-end latency
delivered most tokens in one burst (a starved API process): its client-side TPOT does not
measure decode, and the campaign does not quote it."""

GPU_THROTTLE_DROP_SHARE = 0.10
"""A level whose SM clock (NVML) fell more than this share below its own maximum during the
level ran throttled (power, thermal or an applications-clock cap); boost clocks wander by a
few percent under load, so a tenth is a throttle, not jitter."""

GPU_MEMORY_FULL_SHARE = 0.98
"""A GPU whose memory used reached this share of its total was full. vLLM reserves
`gpu_memory_utilization` (0.9 by default) up front, so a full GPU means another process or an
allocation outside the server's budget."""

LOAD_SLOPE_SIGMAS = 2.0
"""A category 'grows with the batch' (load anatomy) only when its least-squares slope of ms per
decode step against decode requests exceeds this many standard errors."""

LOAD_TRICKLE_SHARE = 0.5
"""A load capture whose steps decode fewer than this share of the requests in flight is named:
a trickle (a request cap, KV space, a client that cannot keep them in flight), not the batch."""

LOAD_RECONCILE_SHARE = 0.05
"""A captured level's time 'adds up' (trace.load_reconcile) when the measured parts leave at
most this share of it unexplained (issue 36's stated tolerance)."""

LOAD_LEVER_SHIFT = 2.0
"""A category whose share of the decode period changes by this factor or more between two
captured levels (and is at least 5 % of one) is a lever whose size depends on the batch."""

# --- stage 05 memory budget -------------------------------------------------------------
MEMORY_BUDGET_AVAILABLE_SHARE = 0.8
"""Without analysis.memory_budget_gb, stage 05 may use this share of the memory available
when it starts (trace.budget): the rest is left to the OS and whatever else runs."""
