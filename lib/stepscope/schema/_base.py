"""The machinery every artifact type shares: a Struct base, reading, writing, checking tables
(no pandas or numpy at import: every run imports this)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from stepscope.errors import StepscopeError
from stepscope.redaction import scrub, scrub_plain, secret_values

SCHEMA_VERSION = 3
"""Version of the run-folder layout and every artifact's keys; written to run.json.

1: before the schema existed (no `schema_version` in run.json). 2: this module. 3: verdict.json
is the serialized Verdict (version 2 wrote a digest of it: `versions._verdict_v2` reads it).
"""


class ArtifactError(StepscopeError):
    """An artifact whose content does not match its schema (a missing key, a wrong type)."""


class Record(msgspec.Struct, kw_only=True, omit_defaults=False):
    """Base of every JSON artifact and table row. Unknown keys are ignored when read,
    so an older reader accepts a newer file; missing required keys are an error."""


class Row(Record):
    """One row of a CSV table. Fields without a default are required columns."""


T = TypeVar("T", bound=Record)

Setting = str | int | float | bool | list[str] | None
"""One value of an open set of named settings (a server's profiler flags, a guard's inputs):
named by the writer, never a nested record."""


@dataclass(frozen=True)
class Artifact:
    """One file or folder of the run folder."""

    path: str
    """Relative to the run folder; `<...>` marks a name part that varies."""
    stage: str
    """The stage that writes it (`run` for the runner)."""
    what: str
    """What it holds, in a phrase (the README's file list)."""
    type: type | None = None
    """The Struct of a JSON file, or the Row of a CSV table; None for files not typed here."""
    optional: bool = False
    """Written only in some runs (named in `what`)."""

    @property
    def kind(self) -> str:
        if self.type is None:
            return "other"
        return "csv" if issubclass(self.type, Row) else "json"


def _plain(obj: Any) -> Any:
    """JSON builtins of what a writer hands over: a record, or plain values (numpy scalars,
    Paths, dataclasses)."""
    from stepscope.runfolder import _json_default

    if isinstance(obj, msgspec.Struct):
        # a record built in memory may hold numpy scalars; int keys become strings, as in JSON
        return msgspec.to_builtins(obj, str_keys=True, enc_hook=_json_default)
    return json.loads(json.dumps(obj, default=_json_default, allow_nan=True))


def _nan_to_none(obj: Any) -> Any:
    """NaN stands for a missing value in the writers' pandas output; the schema says null."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def convert(obj: Any, typ: type[T], where: str) -> T:
    """`obj` (JSON builtins) as `typ`, or an ArtifactError naming the file and the key."""
    try:
        return msgspec.convert(_nan_to_none(obj), typ, strict=False)
    except msgspec.ValidationError as exc:
        raise ArtifactError(f"does not match the schema {typ.__name__}: {exc}", where=where,
                            hint="a stage wrote a file this version does not read; re-run that "
                                 "stage, or see docs/artifacts.md for the keys") from None


def record_of(obj: Any, typ: Any, where: str | None = None) -> Any:
    """A computing module's plain values (numpy scalars, NaN for missing) as `typ`; ArtifactError
    names the type when they do not fit."""
    return convert(_plain(obj), typ, where or getattr(typ, "__name__", str(typ)))


def validate(obj: Any, typ: type[T], where: str) -> dict:
    """The JSON builtins of `obj` after checking them against `typ` (writers call this)."""
    plain = _plain(obj)
    convert(plain, typ, where)
    return plain


def read(path: str | Path, typ: type[T]) -> T:
    """A JSON artifact as its Struct, upgraded first from an older schema version (`schema.versions`);
    ArtifactError (bad JSON or schema) or OSError."""
    from stepscope.schema import versions

    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except ValueError as exc:
        raise ArtifactError(f"not readable as JSON ({exc})", where=str(path)) from None
    if typ.__name__ in versions.UPGRADES:
        version = obj.get("schema_version", 1) if typ.__name__ == "RunRecord" and isinstance(obj, dict) \
            else versions.run_folder_version(path)
        obj = versions.upgrade(obj, typ.__name__, version, SCHEMA_VERSION)
    return convert(obj, typ, str(path))


def read_if_present(path: str | Path, typ: type[T]) -> T | None:
    """`read`, or None when the file is not there."""
    path = Path(path)
    return read(path, typ) if path.is_file() else None


def update(path: str | Path, typ: type[Record], **changes) -> Path:
    """Set top-level keys of a JSON artifact, keeping every other key as written (a newer
    writer's keys this version does not know included), and write it back checked."""
    path = Path(path)
    read(path, typ)  # the file as it is must match before it is changed
    obj = json.loads(path.read_text())
    obj.update(changes)
    return write(path, obj, typ)


def write(path: str | Path, obj: Any, typ: type[Record]) -> Path:
    """Check `obj` (a record of `typ`, or its plain values) against `typ`, then write it
    atomically as JSON (see runfolder.write_json), its strings through the secret filter."""
    from stepscope.runfolder import write_json

    return write_json(path, scrub_plain(validate(obj, typ, str(path))))


def to_builtins(obj: Record) -> dict:
    return msgspec.to_builtins(obj)


def columns(row: type[Row]) -> tuple[str, ...]:
    """Column names in the file (a field may be renamed, e.g. `class_` is `class`)."""
    return tuple(f.encode_name for f in msgspec.structs.fields(row))


def required_columns(row: type[Row]) -> tuple[str, ...]:
    return tuple(f.encode_name for f in msgspec.structs.fields(row) if f.required)


_NUMERIC = (int, float)


def check_frame(df, row: type[Row], where: str):
    """`df` if it has every required column of `row` and its numeric columns hold numbers (columns
    only, not rows); extra columns are kept."""
    import typing

    import pandas as pd

    missing = [c for c in required_columns(row) if c not in df.columns]
    if missing:
        raise ArtifactError(f"missing column(s) {', '.join(missing)} of {row.__name__}", where=where,
                            hint="re-run the stage that writes it; docs/artifacts.md lists the columns")
    for f in msgspec.structs.fields(row):
        name = f.encode_name
        if name not in df.columns or not len(df):
            continue
        args = set(typing.get_args(f.type)) or {f.type}
        args.discard(type(None))
        if args and args <= set(_NUMERIC) and bool not in args:
            col = df[name]
            if not (pd.api.types.is_numeric_dtype(col) or col.isna().all()):
                bad = col[pd.to_numeric(col, errors="coerce").isna() & col.notna()].iloc[0]
                raise ArtifactError(f"column {name} of {row.__name__} holds {bad!r}, not a number",
                                    where=where)
    return df


def write_table(df, path: str | Path, row: type[Row]) -> Path:
    """Check `df` against `row`, then write it as CSV (no index), its text cells through the
    secret filter."""
    path = Path(path)
    check_frame(df, row, str(path))
    _scrub_frame(df).to_csv(path, index=False)
    return path


def _scrub_frame(df):
    """`df` with every text cell scrubbed, or `df` itself when none holds a secret. Each
    distinct text is checked once: a kernel table of millions of rows has few names."""
    from pandas.api.types import is_object_dtype, is_string_dtype

    secrets = secret_values()
    changed = {}
    for name in df.columns:
        col = df[name]
        if not (is_object_dtype(col) or is_string_dtype(col)):
            continue
        try:
            texts = [v for v in col.dropna().unique() if isinstance(v, str)]
        except TypeError:  # cells of lists or dicts: no text to scrub
            continue
        fixes = {v: scrub(v, secrets) for v in texts}
        fixes = {v: clean for v, clean in fixes.items() if clean != v}
        if fixes:
            changed[name] = col.map(lambda v: fixes.get(v, v) if isinstance(v, str) else v)
    return df.assign(**changed) if changed else df
