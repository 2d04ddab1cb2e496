"""The stage registry (`stepscope.stages`) against what each stage's code really reads, and
the `--resume` decisions built on it.

Which method covers which stage's params reads:
- recorded (the stage's library entry point run on a `Params` whose every attribute read is
  logged as its dotted path): 00 (the launch command, the served name, attach against the fake
  server of `stepscope.testing`, the runner's tiny-model step), 02 (`gemm.run_stage`, tiny
  grid, CPU), 03 (`collectives.run_stage` over gloo), 04 (`capture.profiler_settings`), 05
  (`trace.analyze.run_stage` on the committed vLLM CPU TP=2 traces);
- static (an AST scan of each notebook's cells for `params.<section>.<key>` chains, and of
  each call that hands `params` over whole, which must be one the recorded runs cover): 01 and
  04 (a live server and a sweep cannot run here), and every notebook's own reads;
- 06 declares the whole file: the report prints the params snapshot, which a test shows.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import msgspec
import pytest
import yaml

from stepscope import schema, runner
from stepscope.config import deep_merge, iter_leaf_keys, params_from_dict
from stepscope.stages import STAGE_BY_ID, STAGES, WHOLE_PARAMS, covers

REPO = Path(__file__).resolve().parents[1]
DEMO = yaml.safe_load((REPO / "params" / "cpu-demo.yaml").read_text())
TRACES = REPO / "tests" / "data" / "traces"
TP2 = [str(TRACES / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz") for r in (0, 1)]
# Notebook calls that hand `params` over whole, each run under the recorder below.
RECORDED_CALLS = {"00_deploy": {"ensure_server"}, "02_gemm_micro": {"plan_targets", "run_stage"},
                  "03_nccl_burst": {"plan_collectives", "run_stage"}, "04_profiler_capture": {"profiler_settings"},
                  "05_categorize": {"run_stage", "stage_inputs"}}  # run_stage reads through stage_inputs


def _params(over: dict | None = None):
    return params_from_dict(deep_merge(DEMO, over or {}), source="test")


# --------------------------------------------------------------------------- the recorder

_RECORDING: dict[type, type] = {}
_RECORDED_AS: dict[int, tuple[str, set[str], object]] = {}
"""id of a recording instance -> (its dotted prefix, the set its reads go to, the instance itself,
held so that its id is never reused). A copy made by msgspec.structs.replace is not in it."""


def _recording_class(cls: type) -> type:
    """A subclass of a params Struct whose field reads are logged: isinstance and
    msgspec.structs.fields still work on it, so the stage code runs unchanged."""
    if cls not in _RECORDING:
        names = frozenset(cls.__struct_fields__)

        def __getattribute__(self, name):
            value = object.__getattribute__(self, name)
            if name in names and id(self) in _RECORDED_AS:
                prefix, seen, _ = _RECORDED_AS[id(self)]
                if not isinstance(value, msgspec.Struct):
                    seen.add(prefix + name)
            return value

        _RECORDING[cls] = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__})
    return _RECORDING[cls]


def recording(obj, seen: set[str], prefix: str = ""):
    """`obj` (Params) rebuilt so that every leaf read adds its dotted path to `seen`."""
    values = {}
    for name in obj.__struct_fields__:
        v = getattr(obj, name)
        values[name] = recording(v, seen, f"{prefix}{name}.") if isinstance(v, msgspec.Struct) else v
    new = _recording_class(type(obj))(**values)
    _RECORDED_AS[id(new)] = (prefix, seen, new)
    return new


def _read_whole(obj) -> None:
    """Log every leaf of a recording section: msgspec reads a Struct's fields in C, past
    `__getattribute__`, so a section it flattens would otherwise look unread."""
    if id(obj) in _RECORDED_AS:
        for name in obj.__struct_fields__:
            _read_whole(getattr(obj, name))


@pytest.fixture(autouse=True)
def _sections_flattened_by_msgspec_are_read_whole(monkeypatch):
    for owner, name in ((msgspec, "to_builtins"), (msgspec.structs, "asdict")):
        real = getattr(owner, name)

        def logged(obj, *args, _real=real, **kwargs):
            _read_whole(obj)
            return _real(obj, *args, **kwargs)

        monkeypatch.setattr(owner, name, logged)


def test_the_recorder_logs_leaf_paths_and_a_section_handed_on_whole():
    seen: set[str] = set()
    p = recording(_params(), seen)
    hw = p.hardware
    assert hw.peak_mem_bw_gbps == _params().hardware.peak_mem_bw_gbps
    assert seen == {"hardware.peak_mem_bw_gbps"}
    msgspec.structs.asdict(p.micro)  # a section handed over whole is read whole
    assert "micro.gemm.m_values" in seen and "micro.collectives.world_size" in seen


def _undeclared(stage_id: str, seen: set[str]) -> list[str]:
    return sorted(p for p in seen if not covers(STAGE_BY_ID[stage_id], p))


# --------------------------------------------------------------------------- recorded reads


def _read_by_00(tmp_path: Path) -> set[str]:
    from stepscope.serve.launch import attach, build_server_command, served_model_name
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    seen: set[str] = set()
    # model.tiny unset: the runner's tiny-model step reads its keys and stops (no model written).
    p = recording(_params({"model": {"path": str(model), "tiny": None}}), seen)
    build_server_command(p, tmp_path)
    served_model_name(p)
    runner._prepare_model(p, lambda s: None)
    with FakeServer(FakeBehaviour()) as fake:
        attach(recording(_params({"server": {"mode": "attach", "url": fake.base_url}}), seen), tmp_path / "attach")
    return seen


def _read_by_02(tmp_path: Path) -> set[str]:
    from stepscope.micro import gemm

    seen: set[str] = set()
    tiny = {"micro": {"gemm": {"presets": [], "m_values": [1], "repeats": 1, "warmup": 0}}}
    gemm.run_stage(recording(_params(tiny), seen), tmp_path, progress=False)
    return seen


def _read_by_03(tmp_path: Path) -> set[str]:
    from stepscope.micro import collectives

    seen: set[str] = set()
    # world_size unset: the server's TP is read in its place.
    small = {"micro": {"collectives": {"world_size": None, "iters": 1, "warmup": 0, "burst_repeats": 1,
                                       "sizes_bytes": [1024]}}}
    collectives.run_stage(recording(_params(small), seen), tmp_path)
    return seen


def _read_by_04(tmp_path: Path) -> set[str]:
    from stepscope.capture import profiler_settings

    seen: set[str] = set()
    profiler_settings(tmp_path, recording(_params(), seen))  # no server.json: what params asked for
    return seen


def _read_by_05(tmp_path: Path) -> set[str]:
    from stepscope.trace.analyze import run_stage

    (tmp_path / "00_deploy").mkdir()  # a deployed run: server.tp is TP's source
    seen: set[str] = set()
    run_stage(recording(_params({"analysis": {"trace_paths": TP2}}), seen), tmp_path, tmp_path / "05_categorize",
              progress=False)
    return seen


@pytest.mark.parametrize("stage_id, reader, must_see", [
    ("00_deploy", _read_by_00, {"model.path", "server.tp", "capture.profiler_dir", "server.mode"}),
    ("02_gemm_micro", _read_by_02, {"hardware.peak_mem_bw_gbps", "model.quantization", "server.tp"}),
    ("03_nccl_burst", _read_by_03, {"micro.collectives.world_size", "server.tp", "hardware.interconnect"}),
    ("04_profiler_capture", _read_by_04, {"server.profiler.enabled"}),
    ("05_categorize", _read_by_05, {"hardware.peak_mem_bw_gbps", "model.quantization", "server.tp",
                                    "analysis.trace_paths"}),
])
def test_every_params_key_a_stage_reads_is_in_its_registry_entry(tmp_path, stage_id, reader, must_see):
    seen = reader(tmp_path)
    assert must_see <= seen, f"the recorder missed reads it should see: {sorted(must_see - seen)}"
    assert _undeclared(stage_id, seen) == [], f"{stage_id} reads keys its entry in stepscope.stages omits"


def test_the_registry_check_fails_for_the_entry_stage_05_had():
    """The old entry named only `analysis`: the check names what it left out."""
    old = dataclasses.replace(STAGE_BY_ID["05_categorize"], params=("analysis",))
    seen = {"analysis.tp", "hardware.peak_mem_bw_gbps", "model.quantization", "server.tp"}
    assert [p for p in sorted(seen) if not covers(old, p)] == ["hardware.peak_mem_bw_gbps", "model.quantization",
                                                              "server.tp"]


# --------------------------------------------------------------------------- static reads


def _notebook_code(stage_id: str) -> ast.Module:
    nb = json.loads((REPO / "notebooks" / f"{stage_id}.ipynb").read_text())
    return ast.parse("\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"))


def _params_chains(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(dotted `params.` chains read, names of the calls `params` is handed to whole)."""
    chains, whole = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            parts, cur = [], node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "params":
                chains.add(".".join(reversed(parts)))
        if isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(a, ast.Name) and a.id == "params" for a in args):
                f = node.func
                whole.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "?"))
        for child in ast.iter_child_nodes(node):
            child.parent = node
    return chains, whole


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.id)
def test_every_params_chain_in_a_notebook_is_declared(stage):
    chains, whole = _params_chains(_notebook_code(stage.id))
    assert [c for c in sorted(chains) if not covers(stage, c)] == []
    if WHOLE_PARAMS not in stage.params:
        assert whole <= RECORDED_CALLS.get(stage.id, set()), \
            f"{stage.id} hands params whole to {sorted(whole - RECORDED_CALLS.get(stage.id, set()))}: record it above"


def test_the_static_scan_sees_the_notebook_reads():
    chains, whole = _params_chains(_notebook_code("02_gemm_micro"))
    assert {"micro.gemm.dtypes", "hardware.peak_tflops"} <= chains and whole == {"plan_targets", "run_stage"}
    assert "sweep" in _params_chains(_notebook_code("01_macro_sweep"))[0]


def test_every_declared_params_path_names_a_real_key():
    keys = iter_leaf_keys()
    for stage in STAGES:
        for path in (*stage.params, *(k for pair in stage.defaults_from for k in pair)):
            assert path == WHOLE_PARAMS or any(k == path or k.startswith(path + ".") for k in keys), (stage.id, path)


def test_the_appendix_prints_the_whole_params_snapshot_so_06_reads_every_key(tmp_path):
    from stepscope.report import build_report
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "run")
    snapshot = yaml.safe_load((run / "params.yaml").read_text()) if (run / "params.yaml").is_file() else {}
    snapshot = deep_merge(snapshot or {}, {"sweep": {"request_timeout_s": 4321.5}})
    (run / "params.yaml").write_text(yaml.safe_dump(snapshot))
    build_report(run, draw_figures=False)
    appendix = (run / "06_writeup" / "appendix.md").read_text()
    assert "4321.5" in appendix  # a sweep key no report section reads, printed with the snapshot
    assert STAGE_BY_ID["06_writeup"].params == (WHOLE_PARAMS,)


# --------------------------------------------------------------------------- --resume


def _run_folder(tmp_path: Path) -> Path:
    """A run folder with every stage's outputs (synthetic ones, and the real TP=2 traces)."""
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "run")
    traces = run / "04_profiler_capture" / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    for t in TP2:
        (traces / Path(t).name).write_bytes(Path(t).read_bytes())
    return run


def _reruns(run: Path, before, after, record_of=None) -> list[str]:
    """The stages `--resume` runs again when params go from `before` to `after`."""
    out = []
    for s in STAGES:
        rec = record_of(s) if record_of else {"inputs_fingerprint": runner.input_fingerprints(s, before, run)}
        status = schema.StageStatus(status="ok", inputs_fingerprint=rec.get("inputs_fingerprint"))
        if runner._changed_inputs(s, status, runner.input_fingerprints(s, after, run)):
            out.append(s.number)
    return out


def test_a_new_peak_bandwidth_reruns_05_and_06_and_never_the_server(tmp_path):
    run = _run_folder(tmp_path)
    before = _params()
    after = _params({"hardware": {"peak_mem_bw_gbps": 3350.0}, "model": {"quantization": "fp8"}})
    # 02 judges gemm.csv against the peak and picks its backend by the quantization; 03 reads neither.
    assert _reruns(run, before, after) == ["02", "05", "06"]
    assert _reruns(run, before, _params({"hardware": {"peak_tflops": 989.0}})) == ["02", "05", "06"]
    assert _reruns(run, before, _params({"writeup": {"title": "t"}})) == ["06"]
    # The sweep's requests are also the capture's under load (capture.concurrency).
    assert _reruns(run, before, _params({"sweep": {"request_timeout_s": 99.0}})) == ["01", "04", "06"]


def test_a_new_server_reruns_the_stages_that_measure_it(tmp_path):
    run = _run_folder(tmp_path)
    before = _params({"micro": {"collectives": {"world_size": None}}})
    after = _params({"micro": {"collectives": {"world_size": None}}, "server": {"tp": 1}})
    # 01 and 04 measure the server, 02 times the per-rank shapes, 03 the world size it defaults to.
    assert _reruns(run, before, after) == ["00", "01", "02", "03", "04", "05", "06"]
    pinned = _params({"server": {"tp": 1}})  # world_size 2 stays: 03 keeps its measurement
    assert "03" not in _reruns(run, _params(), pinned)


def test_a_new_gemm_table_reruns_05(tmp_path):
    run = _run_folder(tmp_path)
    p = _params()
    fp = {s.id: runner.input_fingerprints(s, p, run) for s in STAGES}
    gemm = run / "02_gemm_micro" / "gemm.csv"
    gemm.write_text(gemm.read_text() + "\n")
    assert _reruns(run, p, p, record_of=lambda s: {"inputs_fingerprint": fp[s.id]}) == ["05", "06"]


def test_a_record_from_before_per_key_fingerprints_relaunches_nothing(tmp_path):
    run = _run_folder(tmp_path)
    p = _params()
    old = {s.id: {"inputs_fingerprint": {"params": "0123456789abcdef",
                                         **{r: runner.input_fingerprints(s, p, run)[r] for r in s.reads}}}
           for s in STAGES}
    assert _reruns(run, p, p, record_of=lambda s: old[s.id]) == ["02", "03", "05", "06"]
    assert _reruns(run, p, p, record_of=lambda s: {}) == []  # no fingerprints at all: as before


def test_resume_reruns_stage_05_after_a_peak_change(tmp_path):
    """Through `run_pipeline --resume`: the stages without a server, each stage's notebook
    replaced by a function that counts it (no kernel, no server)."""
    ran: list[str] = []

    def executor(stage, params_file, run_dir, progress):
        ran.append(stage.number)
        (run_dir / stage.id).mkdir(exist_ok=True)
        return run_dir / "notebooks" / f"{stage.id}.ipynb"

    params_file = tmp_path / "p.yaml"
    params_file.write_text(yaml.safe_dump(deep_merge(DEMO, {"analysis": {"trace_paths": TP2}})))
    kw = dict(stages="02,03,05,06", run_dir=tmp_path / "run", progress=False, notebook_executor=executor)
    assert runner.run_pipeline(params_file, echo=lambda s: None, **kw)[0] == 0
    params_file.write_text(yaml.safe_dump(deep_merge(DEMO, {"analysis": {"trace_paths": TP2},
                                                            "hardware": {"peak_mem_bw_gbps": 3350.0}})))
    ran.clear()
    lines: list[str] = []
    assert runner.run_pipeline(params_file, resume=True, echo=lines.append, **kw)[0] == 0
    assert ran == ["02", "05", "06"]
    assert "  05_categorize: done earlier, but params:hardware changed since: running it again" in lines
    assert "  03_nccl_burst: done earlier, skipped (--resume)" in lines
