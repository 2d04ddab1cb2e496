"""Where the checkout's parts lie: the repository root and the stages' notebooks.

Imports nothing of stepscope, so every module can read it; readers look `NOTEBOOKS_DIR` up at call time so
tests can point it at stand-ins.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
"""The stages' notebooks, `NN_name.ipynb`, and the folder their kernels run in."""
