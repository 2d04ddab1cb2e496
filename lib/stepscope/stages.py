"""The stage registry: for each stage, declared once, what it reads and what it writes.

Three lists of what a stage reads used to live apart (the run folder's params sections, the
runner's folders, the campaign's key paths) and disagreed: stage 05 read `hardware.*`,
`model.quantization` and `server.tp` for its roofline while its entry named only `analysis`,
so `--resume` kept a stale stage 05 after a peak bandwidth changed, and relaunched the
server (stage 00 named `hardware`) for a label it never reads. Now the runner's `--resume`
fingerprints (`stepscope.runner.input_fingerprints`), the campaign's reuse plan
(`stepscope.campaign.plan`) and the run folder all read `STAGES`.
`tests/test_stage_registry.py` records the params keys each stage's code really touches
and fails when an entry here omits one.

A params path is a section (`hardware`), a dotted key (`hardware.peak_mem_bw_gbps`) or
`*` (the whole file: stage 06 prints it in the report). A run-folder path is relative to
the run folder, a file or a folder. `00_deploy/server.json` is read by 01, 04 and 06 but is
no fingerprinted input: it changes with every launch, not with the data; the server's identity
is its params, which the server stages name (`SERVER_KEYS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from stepscope import paths

ANALYSIS_CELL_TIMEOUT_S = 3600.0
"""An hour for one cell of stage 05 or 06: eight 80 MB rank traces load in minutes."""

WHOLE_PARAMS = "*"
"""A params path meaning every key of the file."""

SERVER_KEYS: tuple[str, ...] = ("model.path", "model.served_name", "model.tiny", "server", "capture.profiler_dir")
"""What the server is made of: the keys stage 00 launches (or attaches) it from. A stage that
measures the server (01, 04) reads them too: a new server makes its numbers stale."""

ARCH_KEYS: tuple[str, ...] = ("model.path", "model.config_json", "model.arch_preset", "model.tiny", "model.served_name")
"""Where the served model's architecture comes from (`stepscope.model.architecture_from_params`)."""


@dataclass(frozen=True)
class Stage:
    id: str
    """`NN_name`: the notebook's file stem and the folder it writes."""
    needs: tuple[str, ...]
    """Stages whose artifacts this one cannot do without."""
    uses_server: bool
    params: tuple[str, ...]
    """Params paths it reads: sections, dotted keys, or `*`."""
    reads: tuple[str, ...] = ()
    """Run-folder files and folders it reads (beyond the server record): when one changes
    after the stage ran, `--resume` runs it again."""
    cell_timeout_s: float | None = None
    """Longest a single notebook cell may run before the stage fails (None: no limit). Set
    on the analysis stages, which wait on no server: a cell there that outlasts this has hung
    (a kernel once sat idle while papermill waited for a reply that never came)."""
    figures: tuple[str, ...] = ()
    """File-name prefixes of the figures it writes into figures/ (a campaign copies them with
    a reused stage)."""
    defaults_from: tuple[tuple[str, str], ...] = ()
    """(key, fallback): a key whose unset value means the fallback's (e.g. the collectives'
    world size defaults to server.tp), so the fallback is an input while the key is unset."""

    @property
    def writes(self) -> str:
        """The run-folder folder it writes."""
        return self.id

    @property
    def notebook(self) -> Path:
        return paths.NOTEBOOKS_DIR / f"{self.id}.ipynb"  # read at call time: tests point it at stand-ins

    @property
    def number(self) -> str:
        return self.id[:2]

    @property
    def reusable(self) -> bool:
        """Measured once and copied by a campaign when its params inputs match: no server and
        no other stage's output behind it."""
        return not self.uses_server and not self.reads


STAGES: tuple[Stage, ...] = (
    Stage("00_deploy", (), True, SERVER_KEYS),
    Stage("01_macro_sweep", ("00_deploy",), True, ("sweep", *SERVER_KEYS)),
    # The model's GEMMs at the per-rank size TP gives, judged against the peak bandwidth
    # (gemm.csv's % of peak) and drawn against both peaks; server flags do not change them.
    Stage("02_gemm_micro", (), False,
          ("model", "server.tp", "server.dtype", "micro.gemm", "hardware.gpu_count", "hardware.peak_mem_bw_gbps",
           "hardware.peak_tflops"), figures=("gemm_",)),
    # The model's all-reduce at the world size (server.tp unless micro.collectives says), in
    # micro.collectives.dtype: the architecture's size only, not its quantization.
    Stage("03_nccl_burst", (), False, ("micro.collectives", *ARCH_KEYS, "hardware.name", "hardware.interconnect"),
          figures=("collective_",), defaults_from=(("micro.collectives.world_size", "server.tp"),)),
    # Under load (capture.concurrency beyond 1) the capture sends the sweep's requests.
    Stage("04_profiler_capture", ("00_deploy",), True, ("capture", "sweep", *SERVER_KEYS)),
    # Stage 05's roofline and weight bytes read the model, the peaks and TP; stage 02's table
    # is set beside the trace's GEMMs; the load reconciliation reads the sweep's level records
    # and vLLM's iteration count over them, and the micro-predicted curve stage 02's and 03's
    # predictions and the sweep's levels.
    Stage("05_categorize", (), False, ("analysis", "model", "server.tp", "hardware"),
          reads=("04_profiler_capture", "02_gemm_micro", "03_nccl_burst", "01_macro_sweep/levels",
                 "01_macro_sweep/levels.csv", "01_macro_sweep/server_metrics.csv"),
          cell_timeout_s=ANALYSIS_CELL_TIMEOUT_S),
    # The report prints the params snapshot whole, beside every earlier stage's artifacts.
    Stage("06_writeup", (), False, (WHOLE_PARAMS,),
          reads=("01_macro_sweep", "02_gemm_micro", "03_nccl_burst", "04_profiler_capture", "05_categorize"),
          cell_timeout_s=ANALYSIS_CELL_TIMEOUT_S),
)
STAGE_BY_ID = {s.id: s for s in STAGES}


def value_at(d: Any, path: str) -> Any:
    """The value at a dotted params path of a params mapping (None where a part is missing)."""
    if path == WHOLE_PARAMS:
        return d
    for part in path.split("."):
        d = d.get(part) if isinstance(d, Mapping) else None
    return d


def param_inputs(stage: Stage, params_dict: Mapping[str, Any]) -> dict[str, Any]:
    """{params path: value} of what `stage` reads from a params mapping (`params_to_dict`),
    a fallback included while the key it stands in for is unset."""
    inputs = {p: value_at(params_dict, p) for p in stage.params}
    for key, fallback in stage.defaults_from:
        if value_at(params_dict, key) is None:
            inputs[fallback] = value_at(params_dict, fallback)
    return inputs


def covers(stage: Stage, path: str) -> bool:
    """Whether a read of the params path `path` is among `stage`'s declared inputs (a
    fallback of `defaults_from` included)."""
    declared = (*stage.params, *(fallback for _, fallback in stage.defaults_from))
    return any(d == WHOLE_PARAMS or path == d or path.startswith(d + ".") for d in declared)
