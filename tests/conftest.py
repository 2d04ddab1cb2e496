"""Shared fixtures: where the real traces live, and the repository root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stepscope.runfolder import REPO_ROOT


def _shared_dir() -> Path:
    # CI lays shared/ beside the clone; STEPSCOPE_SHARED overrides for other layouts.
    return Path(os.environ.get("STEPSCOPE_SHARED", REPO_ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    d = _shared_dir() / "traces"
    if not d.is_dir():
        pytest.fail(f"real traces not found at {d}; set STEPSCOPE_SHARED to the shared/ folder")
    return d
