"""No reader outside `stepscope.schema` opens a run-folder JSON file by itself (issue 24 item
2): each goes through `schema.read` (typed, and upgraded from older run folders by the one
versioned reader), so no reader guesses at a key's shape or checks whether it is there.

A function is flagged when it calls `read_json(`, `json.load(` or `json.loads(<path>.read_text())`
on a path built from a run-folder JSON artifact's file name (every JSON file
`schema.ARTIFACTS` lists: `server.json`, `run.json`, `summary.json`, `load_window.json`, ...),
in the call or in what the function assigned to the names it uses (a file name, or a helper
or constant named for it: `server_json_path(run_dir)`). A path that arrives as a parameter or
an attribute set elsewhere is not followed."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from stepscope import schema

LIB = Path(__file__).resolve().parents[1] / "lib" / "stepscope"
RAW_CALLS = {"read_json", "json.load", "json.loads"}

ALLOWED: dict[tuple[str, str], str] = {
    ("schema/versions.py", "run_folder_version"): "the versioned reader finds the run's schema version",
}
"""(file under lib/stepscope, function): why it still reads raw JSON."""


def _names() -> set[str]:
    out = set()
    for a in schema.ARTIFACTS + schema.CAMPAIGN_ARTIFACTS:
        if a.kind == "json":
            name = a.path.rsplit("/", 1)[-1]
            out.add(name.split(">", 1)[-1] if name.startswith("<") else name)  # `<level>.meta.json` -> `.meta.json`
    return {n.lower() for n in out}


def _call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f"{f.value.id}.{f.attr}"
    return ""


def _strings(node: ast.AST) -> str:
    """The string constants and identifiers in `node`, lower case, joined: a path's file name
    is one of them (`"server.json"`), or names it (`server_json_path(run_dir)`, `SERVER_JSON`)."""
    parts = []
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            parts.append(n.value)
        elif isinstance(n, ast.Name):
            parts.append(n.id)
        elif isinstance(n, ast.Attribute):
            parts.append(n.attr)
    return " ".join(parts).lower()


def _assigned(fn: ast.AST) -> dict[str, str]:
    """{name: the strings of every value assigned to it in `fn`} (tuple targets included)."""
    out: dict[str, str] = {}
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for n in (n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                out[n.id] = out.get(n.id, "") + " " + _strings(node.value)
    return out


def _path_text(arg: ast.AST, assigned: dict[str, str]) -> str:
    """The strings the path a raw read opens is built from: in the argument (the receiver of
    its `.read_text()`) and in what the names in it were assigned."""
    names = {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
    return _strings(arg) + " " + " ".join(assigned.get(n, "") for n in names)


def raw_readers(source: str, names: set[str]) -> list[str]:
    """Functions of `source` that read JSON raw from a path built from a run-folder JSON
    file's name. `json.loads` counts only on a file's text (`p.read_text()`): on a string
    from elsewhere (a server's answer, a command-line flag) it reads no file."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        assigned = _assigned(fn)
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and _call_name(n) in RAW_CALLS):
            if not call.args:
                continue
            arg = call.args[0]
            if _call_name(call) == "json.loads":
                if not (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)
                        and arg.func.attr in ("read_text", "read_bytes")):
                    continue
                arg = arg.func.value
            text = _path_text(arg, assigned)
            if any(name in text or name.replace(".", "_") in text for name in names):
                found.append(fn.name)
                break
    return found


@functools.cache
def _present() -> frozenset[tuple[str, str]]:
    names = _names()
    return frozenset((path.relative_to(LIB).as_posix(), fn) for path in sorted(LIB.rglob("*.py"))
                     for fn in raw_readers(path.read_text(), names))


def test_no_raw_reader_of_run_folder_json_outside_the_schema():
    assert {"server.json", "run.json", "summary.json", "load_window.json"} <= _names()
    flagged = sorted(f"{rel}:{fn}" for rel, fn in _present() - set(ALLOWED))
    assert not flagged, ("read these through stepscope.schema (schema.read / read_if_present / update): "
                         + ", ".join(flagged))


def test_the_allow_list_has_no_stale_row():
    stale = sorted(set(ALLOWED) - _present())
    assert not stale, f"no longer raw, delete from ALLOWED: {stale}"


def test_the_finder_flags_a_raw_server_json_reader():
    src = ('def f(run_dir):\n    p = run_dir / "00_deploy" / "server.json"\n    return read_json(p)["base_url"]\n'
           'def g(p):\n    return json.loads(p.read_text())\n')
    assert raw_readers(src, {"server.json"}) == ["f"]
