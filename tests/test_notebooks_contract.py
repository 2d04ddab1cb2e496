"""Notebook contract: thin, clean, parameterised notebooks that use every params key."""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from stepscope.config import iter_leaf_keys
from stepscope.paths import REPO_ROOT
from stepscope.stages import STAGES

NOTEBOOKS = [s.notebook for s in STAGES]


def test_every_stage_has_its_notebook_and_nothing_else():
    on_disk = sorted(p.name for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
    assert on_disk == sorted(p.name for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_hygiene(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {path.stem[:2]}")
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    names = {t.id for t in ast.walk(ast.parse(tagged[0].source)) if isinstance(t, ast.Name)}
    assert {"params_file", "run_dir"} <= names
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [] and cell.execution_count is None, "committed without outputs"
        tree = ast.parse(cell.source)
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                            ast.ClassDef, ast.Lambda))]
        assert not defs, f"{path.name}: logic belongs in lib/, not in a notebook cell"


def _code_outside_config() -> str:
    texts = [p.read_text() for p in (REPO_ROOT / "lib" / "stepscope").rglob("*.py")
             if p.name != "config.py"]
    for nb in NOTEBOOKS:
        texts += [c.source for c in nbformat.read(nb, as_version=4).cells if c.cell_type == "code"]
    return "\n".join(texts)


def test_every_params_key_is_used_by_some_stage():
    code = _code_outside_config()
    unused = [k for k in iter_leaf_keys()
              if not re.search(r"\." + re.escape(k.rsplit(".", 1)[-1]) + r"\b", code)]
    assert unused == [], f"params keys no stage reads: {unused}"
