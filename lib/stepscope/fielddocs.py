"""Generated docs read a field's meaning from the string literal written under it (with `ast`), for both
docs/params.md and docs/artifacts.md, so docs and schema cannot drift."""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from pathlib import Path


@functools.lru_cache(maxsize=None)
def module_field_docs(module_name: str) -> dict[tuple[str, str], str]:
    """{(class name, field name): the literal under that field, whitespace folded} for every
    top-level class of the module."""
    tree = ast.parse(inspect.getsource(sys.modules[module_name]))
    docs: dict[tuple[str, str], str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt, nxt in zip(node.body, node.body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[(node.name, stmt.target.id)] = " ".join(nxt.value.value.split())
    return docs


def field_doc(cls: type, attr: str) -> str:
    """The field's literal, looked up along the class's bases (an inherited field keeps the
    base's doc); only stepscope's own modules are read."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("stepscope."):
            continue
        doc = module_field_docs(klass.__module__).get((klass.__name__, attr))
        if doc:
            return doc
    return ""


def replace_between(text: str, markers: tuple[str, str], body: str, where: str) -> str:
    """`text` with what lies between the two marker lines replaced by `body`."""
    begin, end = markers
    if begin not in text or end not in text:
        raise ValueError(f"{where}: markers {begin.strip()} ... {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + body + "\n" + end + tail


def rewrite_between(path: str | Path, markers: tuple[str, str], body: str) -> None:
    """Rewrite the block between `markers` in the file at `path`."""
    p = Path(path)
    p.write_text(replace_between(p.read_text(), markers, body, str(p)))
