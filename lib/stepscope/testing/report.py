"""Reading a rendered report.md in tests: a section by its title, whatever number it was given
(sections are numbered in reading order, and a run without load captures has one fewer)."""

from __future__ import annotations

import re

REPORT_MAX_BYTES = 25_000
"""The most report.md may weigh (`len(md.encode())`), the demo's included: a newcomer reads it in a
minute (issue 37); the tables it links rather than shows are the appendix's."""
PARAGRAPH_MAX_WORDS = 120
"""The longest paragraph or list item report.md may hold."""


def section(md: str, title: str) -> str:
    """The body of the `## N. <title>...` section (up to the next `## `); '' when it is absent."""
    m = re.search(rf"^## \d+\. {re.escape(title)}.*$", md, re.M)
    if m is None:
        return ""
    rest = md[m.end():]
    nxt = re.search(r"^## ", rest, re.M)
    return rest[:nxt.start()] if nxt else rest


def paragraphs(md: str) -> list[str]:
    """The report's prose, one entry per paragraph or list item: tables, code and headings left out."""
    out = []
    for block in re.split(r"\n\s*\n", re.sub(r"```.*?```", "", md, flags=re.S)):
        block = block.strip()
        if not block or block.startswith(("|", "#", "![")):
            continue
        items = re.split(r"^- ", block, flags=re.M)
        out += [i.strip() for i in items if i.strip()]
    return out
