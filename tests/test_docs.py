"""The project's own reference in docs/: every pointer into it resolves, the index lists
every page, and nothing cites a reference file the repository does not hold."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_POINTER = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)#([A-Za-z0-9_-]+)")
_PRIVATE = re.compile(r"FACTS(\.md)?\s*(§|section)")


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    keep = (".py", ".md", ".yaml", ".yml", ".ipynb", ".toml", ".txt", "")
    files = [ROOT / p for p in out.stdout.splitlines() if not p.startswith("tests/data/")]
    return [p for p in files if p.suffix in keep and p.is_file()]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", page.read_text(), re.M)}


def test_slug_matches_github_rules():
    assert github_slug("The profiler's text table") == "the-profilers-text-table"
    assert github_slug("vLLM CPU backend") == "vllm-cpu-backend"


def test_every_pointer_into_docs_resolves():
    pointers = []
    for path in _tracked_text_files():
        for m in _POINTER.finditer(path.read_text(errors="replace")):
            pointers.append((path.relative_to(ROOT), m.group(1), m.group(2)))
    assert len(pointers) >= 15, "the code cites docs/methods.md in about 20 places"
    broken = [(str(p), f"{page}#{a}") for p, page, a in pointers
              if not (DOCS / page).is_file() or a not in anchors(DOCS / page)]
    assert not broken, f"pointers into docs/ that do not resolve: {broken}"


def test_no_citation_of_a_file_outside_the_repository():
    hits = [str(p.relative_to(ROOT)) for p in _tracked_text_files()
            if p.name != "test_docs.py" and _PRIVATE.search(p.read_text(errors="replace"))]
    assert not hits, f"cite docs/ instead of FACTS.md in: {hits}"


def test_index_links_every_page():
    index = (DOCS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([A-Za-z0-9_.-]+\.md)\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert "methods.md" in linked
    assert pages <= linked, f"docs/README.md does not link: {sorted(pages - linked)}"
    assert linked <= pages, f"docs/README.md links pages that do not exist: {sorted(linked - pages)}"
