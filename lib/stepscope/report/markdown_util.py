"""Markdown pieces and the self-contained HTML rendering of a markdown report."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import markdown as md_lib
import pandas as pd

from stepscope.report.numbers import fmt_num  # noqa: F401  (re-exported: the one formatter)
from stepscope.wording import short_name, short_names

MISSING_MARK = "⚠ Not measured"


def _cell(v: Any, f: Callable[[Any], str] | None) -> str:
    s = f(v) if f else fmt_num(v)
    return s.replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame, columns: Sequence[tuple[str, str]] | None = None,
             formats: dict[str, Callable[[Any], str]] | None = None, max_rows: int | None = None) -> str:
    """A markdown pipe table. `columns` is [(column, header)]; missing columns are skipped."""
    if columns is None:
        columns = [(c, c) for c in df.columns]
    columns = [(c, h) for c, h in columns if c in df.columns]
    formats = dict(formats or {})
    for c, _ in columns:
        # A float column holding only whole numbers is a count read back from CSV: print it as one.
        if c not in formats and pd.api.types.is_float_dtype(df[c]):
            vals = df[c].dropna()
            vals = vals[~vals.isin([float("inf"), float("-inf")])]
            if len(vals) and (vals == vals.round()).all():
                formats[c] = lambda v: fmt_num(int(v)) if pd.notna(v) and abs(v) != float("inf") else fmt_num(v)
    rows = df if max_rows is None else df.head(max_rows)
    out = ["| " + " | ".join(h.replace("|", "\\|") for _, h in columns) + " |",
           "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) and df[c].dtype != bool else "---"
                          for c, _ in columns) + "|"]
    for _, r in rows.iterrows():
        out.append("| " + " | ".join(_cell(r[c], formats.get(c)) for c, _ in columns) + " |")
    if max_rows is not None and len(df) > max_rows:
        out.append(f"\n*{len(df) - max_rows} more rows not shown.*")
    return "\n".join(out) + "\n"


def kv_table(pairs: Sequence[tuple[str, Any]], headers: tuple[str, str] = ("", "")) -> str:
    out = [f"| {headers[0]} | {headers[1]} |", "|---|---|"]
    for k, v in pairs:
        out.append(f"| {k} | {_cell(v, None)} |")
    return "\n".join(out) + "\n"


def code_name(name: Any, width: int = 80) -> str:
    """A kernel or op name as a code span, cut in the middle to `width` characters."""
    return f"`{short_name(str(name), width)}`"


def code_names(names: Sequence[Any], width: int = 80) -> list[str]:
    """The names of one table as code spans, cut to `width` and kept apart where they differ
    (`wording.short_names`): two rows never look alike unless their names are."""
    return [f"`{n}`" for n in short_names([str(x) for x in names], width)]


def missing_box(what: str, files: Sequence[str], why: str | None = None) -> str:
    """A visible box saying a section was not measured, naming the files it needed."""
    need = ", ".join(f"`{f}`" for f in files)
    text = f"> **{MISSING_MARK}:** {what}. This section needs {need}, which the run folder does not hold"
    text += f" ({why})." if why else "."
    return text + "\n"


def image(rel_path: str, alt: str) -> str:
    return f"![{alt}]({rel_path})\n"


CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1.5em;color:#1d1d1f;line-height:1.5;font-size:15px}
h1{border-bottom:3px solid #1f4e9c;padding-bottom:.3em}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em;color:#1f4e9c}
h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.8em 0;font-size:13px;display:block;overflow-x:auto}
th,td{border:1px solid #d0d7de;padding:4px 8px}
th{background:#f3f6fa;text-align:left}
tr:nth-child(even) td{background:#fafbfc}
td[style*="right"],th[style*="right"]{font-variant-numeric:tabular-nums}
img{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px;font-size:90%}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;border-radius:4px;font-size:12px}
pre code{background:none;padding:0}
blockquote{margin:1em 0;padding:.6em 1em;border-left:4px solid #999;background:#f7f7f7}
blockquote.missing{border-left-color:#d97706;background:#fff7e6}
blockquote.verdict{border-left-color:#1f4e9c;background:#eef4fc;font-size:16px}
"""

_IMG_RE = re.compile(r'<img([^>]*?)src="([^"]+)"')


def markdown_to_html(md_text: str, base_dir: Path, title: str) -> str:
    """Render markdown to one self-contained HTML page: images inlined as data URIs, CSS inline.

    `base_dir` is where relative image paths in the markdown are resolved from (the folder of
    report.md). An image that cannot be read becomes a visible note instead of a broken link.
    """
    body = md_lib.markdown(md_text, extensions=["tables", "fenced_code", "toc", "sane_lists"],
                           extension_configs={"toc": {"toc_depth": "2-3"}}, output_format="html")

    def inline(m: re.Match) -> str:
        attrs, src = m.group(1), m.group(2)
        if src.startswith("data:"):
            return m.group(0)
        p = (base_dir / html.unescape(src)).resolve()
        try:
            data = base64.b64encode(p.read_bytes()).decode("ascii")
        except OSError:
            return f'<span class="missing-image">[image not found: {html.escape(src)}]</span><img{attrs}src=""'
        mime = "image/svg+xml" if p.suffix.lower() == ".svg" else "image/png"
        return f'<img{attrs}src="data:{mime};base64,{data}"'

    body = _IMG_RE.sub(inline, body)
    body = re.sub(r"<blockquote>(\s*<p><strong>" + re.escape(MISSING_MARK) + ")",
                  r'<blockquote class="missing">\1', body)
    body = re.sub(r"<blockquote>(\s*<p><strong>(Verdict|In short))", r'<blockquote class="verdict">\1', body)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")
