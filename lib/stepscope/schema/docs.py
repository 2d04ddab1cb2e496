"""Generated documentation: docs/artifacts.md, from the schema and each field's docstring
(`stepscope.fielddocs`); a test keeps them equal."""

from __future__ import annotations

import typing
from pathlib import Path

import msgspec

from stepscope.fielddocs import field_doc
from stepscope.schema import ARTIFACTS, CAMPAIGN_ARTIFACTS, Artifact, Record, Row

def class_doc(cls: type) -> str:
    doc = cls.__doc__ or ""
    return "" if doc in (Record.__doc__, Row.__doc__) else " ".join(doc.split())


def type_name(tp) -> str:
    """A short, readable name of a field's type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(type_name(a) for a in args)
    if origin is list:
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict:
        return f"{{{type_name(args[0])}: {type_name(args[1])}}}" if args else "object"
    if tp is typing.Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _struct_in(tp) -> type | None:
    """The Struct a field holds: itself, in a list, as a dict value, or beside null."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    for a in typing.get_args(tp):
        inner = _struct_in(a)
        if inner is not None:
            return inner
    return None


def _field_line(f: msgspec.structs.FieldInfo, cls: type) -> str:
    req = "" if f.required else ", optional"
    doc = field_doc(cls, f.name)
    return f"`{f.encode_name}` ({type_name(f.type)}{req})" + (f": {doc}" if doc else "")


def struct_bullets(cls: type, indent: int = 0, depth: int = 2, seen: tuple = ()) -> list[str]:
    """Nested bullets for every field of `cls`; Structs inside are expanded `depth` levels."""
    lines = []
    pad = "  " * indent
    shown: set[type] = set()  # a record of several fields of one type is spelled out once
    for f in msgspec.structs.fields(cls):
        lines.append(f"{pad}- {_field_line(f, cls)}")
        inner = _struct_in(f.type)
        if inner is None or inner in seen:
            continue
        if inner in shown:
            lines.append(f"{pad}  - the fields of `{inner.__name__}` above")
            continue
        shown.add(inner)
        if issubclass(inner, Row):
            table = next((a.path.rsplit("/", 1)[-1] for a in ARTIFACTS if a.type is inner), None)
            if table:
                lines.append(f"{pad}  - rows of `{table}`")
                continue
        if depth > 0:
            lines += struct_bullets(inner, indent + 1, depth - 1, seen + (cls,))
    return lines


def run_folder_tree() -> str:
    """The README's run-folder listing: every artifact, grouped by folder."""
    lines = ["outputs/<run-id>/"]
    folder = None
    for a in ARTIFACTS:
        head, _, name = a.path.partition("/")
        when = " (when present)" if a.optional else ""
        if not head[:2].isdigit():
            lines.append(f"  {a.path:<31} {a.what}{when}")
            continue
        if head != folder:
            folder = head
            lines.append(f"  {head}/")
        lines.append(f"    {name:<29} {a.what}{when}")
    return "\n".join(lines)


def _columns_table(row: type[Row]) -> list[str]:
    out = ["| column | type | meaning |", "|---|---|---|"]
    for f in msgspec.structs.fields(row):
        req = "" if f.required else " (optional)"
        out.append(f"| `{f.encode_name}` | {type_name(f.type).replace(' | ', ' or ')}{req} | "
                   f"{field_doc(row, f.name).replace('|', '/')} |")
    return out


def artifacts_markdown() -> str:
    """docs/artifacts.md: every file of the run folder, every key and column."""
    import stepscope.schema as schema

    out = ["# The run folder's artifacts", "",
           "Generated from `lib/stepscope/schema/` by `python -m stepscope.schema`; a test keeps this file "
           "equal to the schema. Edit the schema, not this file.",
           "", schema.__doc__.split("\n\n", 1)[1].strip(), "",
           f"Schema version: **{schema.SCHEMA_VERSION}** (written to `run.json` as `schema_version`).", "",
           "```", run_folder_tree(), "```", ""]
    out += _typed_sections(ARTIFACTS)
    out += ["# The campaign folder", "", _campaign_intro(), "", "```", campaign_folder_tree(), "```", ""]
    out += _typed_sections(CAMPAIGN_ARTIFACTS)
    return "\n".join(out)


def _typed_sections(artifacts: tuple[Artifact, ...]) -> list[str]:
    out: list[str] = []
    for a in artifacts:
        if a.type is None:
            continue
        out += [f"## `{a.path}`", "", f"Written by {_writer(a)}; typed as `stepscope.schema.{a.type.__name__}`. "
                + (class_doc(a.type) or a.what[:1].upper() + a.what[1:] + "."), ""]
        if a.kind == "csv":
            out += _columns_table(a.type) + [""]
        else:
            out += struct_bullets(a.type, depth=3) + [""]
    return out


def _campaign_intro() -> str:
    return ("`stepscope campaign PARAMS` writes one ordinary run folder per run (above) into a campaign "
            "folder, beside these files of its own (`stepscope.schema.CAMPAIGN_ARTIFACTS`):")


def campaign_folder_tree() -> str:
    lines = ["outputs/<campaign-id>/"]
    for a in CAMPAIGN_ARTIFACTS:
        when = " (when present)" if a.optional else ""
        lines.append(f"  {a.path:<48}{a.what}{when}")
    return "\n".join(lines)


def _writer(a: Artifact) -> str:
    if a.stage == "campaign":
        return "`stepscope campaign`"
    return "the runner" if a.stage == "run" else f"stage {a.stage}"


def update(artifacts_md: str | Path = "docs/artifacts.md") -> None:
    p = Path(artifacts_md)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(artifacts_markdown() + "\n")
