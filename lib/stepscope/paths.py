"""Where the checkout's parts lie: the repository root and the stages' notebooks.

It imports nothing of stepscope, so every module can read it: the stage registry
(`Stage.notebook`) and the run folder among them, which therefore need not import each other.
Tests point `NOTEBOOKS_DIR` at stand-in notebooks; readers look it up at call time
(`paths.NOTEBOOKS_DIR`, not a copy taken at import) so that the stand-ins are seen.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
"""The stages' notebooks, `NN_name.ipynb`, and the folder their kernels run in."""
