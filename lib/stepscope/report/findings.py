"""The verdict as tables to work with in notebook 06, writing nothing
(docs/verdict.md#working-with-the-findings-in-a-notebook).
"""

from __future__ import annotations

import contextlib
import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
from msgspec.structs import asdict

from stepscope import thresholds
from stepscope.config import WriteupParams
from stepscope.errors import StepscopeError
from stepscope.schema.verdict import Verdict
from stepscope.wording import html_text


@dataclass(frozen=True, repr=False)
class Findings:
    """One run folder's verdict and the thresholds it was judged with (the defaults unless
    `overrides` says otherwise)."""

    run_dir: Path
    verdict: Verdict
    overrides: tuple[tuple[str, float], ...] = ()

    def get_findings(self) -> pd.DataFrame:
        """One row per sentence of the verdict, in the report's order: the finding it was
        rendered from (its type), its subject where it has one, and the sentence."""
        from stepscope.report import prose

        head = {id(f) for src, _ in prose.headline_sentences(self.verdict) for f in src}
        rows = [{"finding": type(src[0]).__name__, "subject": _subject(src[0]), "sentence": s,
                 "in_headline": id(src[0]) in head} for src, s in prose.sentences(self.verdict)]
        return pd.DataFrame(rows, columns=["finding", "subject", "sentence", "in_headline"])

    def get_levers(self) -> pd.DataFrame:
        """Every lever left after the guards: category levers (with stage 05's coherence mark,
        largest kernels and module), the time between steps and the gaps inside the step."""
        v = self.verdict
        rows = [{"kind": "category", "name": lv.category, **asdict(lv)} for lv in v.levers]
        if v.between_steps is not None:
            rows.append({"kind": "between steps", "name": "between steps", **asdict(v.between_steps)})
        rows += [{"kind": g.kind, "name": g.kind, **asdict(g)} for g in v.gap_levers]
        df = pd.DataFrame(rows)
        if df.empty:
            return pd.DataFrame(columns=["kind", "name", "ceiling_x", "biggest"])
        df["biggest"] = df["name"] == (v.biggest.name if v.biggest is not None else None)
        first = ["kind", "name", "ceiling_x", "biggest"]
        return df[first + [c for c in df.columns if c not in first]]

    def get_guards(self) -> pd.DataFrame:
        """Every invariant checked: whether it holds, the values it read, what it withdrew."""
        return pd.DataFrame([{"invariant": g.invariant, "subject": g.subject, "holds": g.holds,
                              "values": dict(g.values), "withdrawn": list(g.withdrawn)} for g in self.verdict.guards],
                            columns=["invariant", "subject", "holds", "values", "withdrawn"])

    def get_finding(self, name: str) -> Any:
        """One field of the verdict (`dominant`, `biggest`, `levers`, `plateau`, ...)."""
        names = list(self.verdict.__struct_fields__)
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            raise StepscopeError(f"the verdict has no finding {name!r}", where="Findings.get_finding",
                                 hint=(f"did you mean {near[0]!r}? " if near else "") + f"findings: {', '.join(names)}")
        return getattr(self.verdict, name)

    def with_thresholds(self, **overrides: float) -> Findings:
        """The verdict of the same run folder judged with other thresholds, e.g.
        `with_thresholds(COMM_EXPOSED_SHARE=0.3)`; the rest keep their defaults."""
        return verdict(self.run_dir, thresholds_override=overrides)

    def changed(self, other: Findings) -> pd.DataFrame:
        """The sentences said by one of the two and not the other (`in` says which)."""
        a, b = set(self.get_findings()["sentence"]), set(other.get_findings()["sentence"])
        rows = ([{"in": "this", "sentence": s} for s in self.get_findings()["sentence"] if s not in b]
                + [{"in": "other", "sentence": s} for s in other.get_findings()["sentence"] if s not in a])
        return pd.DataFrame(rows, columns=["in", "sentence"])

    def __repr__(self) -> str:
        return f"Findings of {self.run_dir.name}{self._said()}\n" + self.get_findings().to_string(index=False)

    def _said(self) -> str:
        return f" (thresholds: {', '.join(f'{k}={v:g}' for k, v in self.overrides)})" if self.overrides else ""

    def _repr_html_(self) -> str:
        return (f"<p>Findings of {html_text(self.run_dir.name)}{self._said()}</p>"
                + self.get_findings().to_html(index=False))  # to_html escapes its cells


def verdict(run_dir: str | Path, writeup: WriteupParams | None = None,
            thresholds_override: dict[str, float] | None = None) -> Findings:
    """The run folder's verdict, computed as stage 06 computes it (`report_context`), as a
    `Findings`; `thresholds_override` judges it with other values of `stepscope.thresholds`."""
    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.build import report_context, writeup_params_from

    run_dir = Path(run_dir)
    a = load_run_artifacts(run_dir)
    overrides = dict(thresholds_override or {})
    with _thresholds(overrides):
        v = report_context(a, writeup_params_from(a, writeup)).verdict
    return Findings(run_dir, v, tuple(sorted(overrides.items())))


@contextlib.contextmanager
def _thresholds(overrides: dict[str, float]) -> Iterator[None]:
    """Every stepscope module that imported a threshold by name sees `overrides` inside the block. A
    field default computed at import keeps the old value: the judgement changes, its echo does not."""
    known = {k for k in vars(thresholds) if k.isupper()}
    for name in overrides:
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=1)
            raise StepscopeError(f"no threshold named {name!r}", where="stepscope.thresholds",
                                 hint=f"did you mean {near[0]!r}?" if near else "see stepscope/thresholds.py")
    original = {name: getattr(thresholds, name) for name in overrides}
    saved: list[tuple[Any, str, Any]] = []
    try:
        for mod in [m for k, m in list(sys.modules.items()) if k.startswith("stepscope") and m is not None]:
            for name, value in overrides.items():
                if name in vars(mod) and vars(mod)[name] is original[name]:
                    saved.append((mod, name, original[name]))
                    setattr(mod, name, value)
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


def _subject(finding: Any) -> str | None:
    for attr in ("subject", "category", "name", "quantity"):
        v = getattr(finding, attr, None)
        if isinstance(v, str):
            return v
    return None
