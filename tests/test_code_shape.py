"""House rules a reviewer would otherwise check by hand: functions short enough to read at once."""

from __future__ import annotations

import ast

MAX_FUNCTION_LINES = 80


def test_no_library_function_is_longer_than_80_lines(repo_root):
    long = []
    for f in sorted((repo_root / "lib" / "stepscope").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{f.relative_to(repo_root)}:{node.lineno} {node.name} ({n} lines)")
    assert long == [], "split these functions:\n" + "\n".join(long)
