"""Markdown pieces and the self-contained HTML rendering of a markdown report."""

from __future__ import annotations

import base64
import html
import re
import stat
import xml.etree.ElementTree as etree
from pathlib import Path
from typing import Any, Callable, Sequence

import markdown as md_lib
import pandas as pd
from markdown.treeprocessors import Treeprocessor

from stepscope.wording import fmt_num
from stepscope.wording import Md, md_code, md_text, one_line, short_name, short_names

MISSING_MARK = "⚠ Not measured"


def _cell(v: Any, f: Callable[[Any], str] | None) -> str:
    """One table cell: a formatter's output or stepscope's own Markdown (`Md`) as it is, any
    other string escaped as outside text (`md_text`), a number formatted; pipes escaped."""
    s = f(v) if f else v if isinstance(v, Md) else md_text(v) if isinstance(v, str) else fmt_num(v)
    return one_line(s).replace("|", "\\|")


def _missing(col: pd.Series) -> pd.Series:
    """Cells a table would print as "–" or leave blank."""
    return col.isna() | col.astype(str).str.strip().isin(["", "–"])


def measured_only(df: pd.DataFrame, columns: Sequence[tuple[str, str]], keys: Sequence[str] = ()
                  ) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """The rows and columns of a table that hold a measurement: a column missing in every row
    goes, and so does a row whose cells outside `keys` (the columns that name a row) are all missing."""
    cols = [(c, h) for c, h in columns if c in df.columns and not _missing(df[c]).all()]
    values = [c for c, _ in cols if c not in keys]
    if values and len(df):
        df = df[~pd.concat([_missing(df[c]) for c in values], axis=1).all(axis=1)]
    return df, cols


def _printed(df: pd.DataFrame, c: str, formats: dict[str, Callable[[Any], str]] | None) -> list[str]:
    """A column's cells as the table prints them (Python scalars: numpy's bool is no bool)."""
    return [_cell(v, (formats or {}).get(c)) for v in df[c].tolist()]


ZERO_CELLS = frozenset({"0", "0.00", "0.0"})


def constant_caption(df: pd.DataFrame, columns: Sequence[tuple[str, str]], keep: Sequence[str] = (),
                     formats: dict[str, Callable[[Any], str]] | None = None, settings: Sequence[str] = ()
                     ) -> tuple[list[tuple[str, str]], str]:
    """Columns with one value in every row leave the table for its caption: (columns left, caption). A
    number goes only when zero or a setting: measurements that agree are still measurements."""
    if len(df) < 2:
        return list(columns), ""

    def movable(c: str) -> bool:
        cells = set(_printed(df, c, formats))
        numeric = pd.api.types.is_numeric_dtype(df[c]) and df[c].dtype != bool
        return len(cells) == 1 and (not numeric or c in settings or cells <= ZERO_CELLS)
    same = [(c, h) for c, h in columns if c in df.columns and c not in keep and movable(c)]
    caption = "; ".join(f"{md_text(h)}: {_printed(df, c, formats)[0]}" for c, h in same)
    return [x for x in columns if x not in same], caption


DUPLICATE_MIN_ROWS = 3
"""Two columns alike over fewer rows may agree by chance."""


def duplicate_caption(df: pd.DataFrame, columns: Sequence[tuple[str, str]], keys: Sequence[str] = (),
                      formats: dict[str, Callable[[Any], str]] | None = None) -> tuple[list[tuple[str, str]], str]:
    """Columns that read the same as an earlier one in every row leave the table for the caption:
    ("columns left", "b = a"), compared as printed."""
    printed = {c: _printed(df, c, formats) for c, _ in columns if c in df.columns}
    kept: list[tuple[str, str]] = []
    said = []
    for c, h in columns:
        twin = next((k for k in kept if k[0] not in keys and c not in keys and printed.get(k[0]) == printed.get(c)), None)
        if twin is not None and len(df) >= DUPLICATE_MIN_ROWS:
            said.append(f"{md_text(h)} = {md_text(twin[1])}")
        else:
            kept.append((c, h))
    return kept, "; ".join(said)


def compact_table(df: pd.DataFrame, columns: Sequence[tuple[str, str]], keys: Sequence[str] = (),
                  keep: Sequence[str] = (), settings: Sequence[str] = (), **kw: Any) -> str:
    """`md_table` of what was measured, constant or repeated columns said once above it."""
    table, cols = measured_only(df, columns, keys)
    formats = kw.get("formats")
    cols, same = constant_caption(table, cols, keep=[*keys, *keep], formats=formats, settings=settings)
    table, cols = measured_only(table, cols, keys)  # a row that held only the caption's values goes too
    cols, twins = duplicate_caption(table, cols, [*keys, *keep], formats=formats)
    caption = "; ".join(x for x in (same, twins) if x)
    return (f"*In every row: {caption}.*\n\n" if caption else "") + md_table(table, cols, **kw)


def md_table(df: pd.DataFrame, columns: Sequence[tuple[str, str]] | None = None,
             formats: dict[str, Callable[[Any], str]] | None = None, max_rows: int | None = None,
             md_columns: Sequence[str] = ()) -> str:
    """A markdown pipe table of [(column, header)], missing columns skipped. Text cells are escaped
    except in `md_columns`, Markdown stepscope wrote (a DataFrame keeps no `Md` mark)."""
    if columns is None:
        columns = [(c, c) for c in df.columns]
    columns = [(c, h) for c, h in columns if c in df.columns]
    formats = dict(formats or {})
    for c, _ in columns:
        # A float column holding only whole numbers is a count read back from CSV: print it as one.
        if c in md_columns and c not in formats:
            formats[c] = lambda v: Md(v) if isinstance(v, str) else fmt_num(v)
        if c not in formats and pd.api.types.is_float_dtype(df[c]):
            vals = df[c].dropna()
            vals = vals[~vals.isin([float("inf"), float("-inf")])]
            if len(vals) and (vals == vals.round()).all():
                formats[c] = lambda v: fmt_num(int(v)) if pd.notna(v) and abs(v) != float("inf") else fmt_num(v)
    rows = df if max_rows is None else df.head(max_rows)
    out = ["| " + " | ".join(md_text(h).replace("|", "\\|") for _, h in columns) + " |",
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


def code_name(name: Any, width: int = 80) -> Md:
    """A kernel or op name as a code span (`md_code`), cut in the middle to `width` characters."""
    return md_code(short_name(str(name), width))


def code_names(names: Sequence[Any], width: int = 80) -> list[Md]:
    """The names of one table as code spans, cut to `width` and kept apart where they differ
    (`wording.short_names`): two rows never look alike unless their names are."""
    return [md_code(n) for n in short_names([str(x) for x in names], width)]


def missing_box(what: str, files: Sequence[str], why: str | None = None) -> str:
    """A visible box saying a section was not measured, naming the files it needed (each a code
    span unless already `Md`); `why` (a stage's status and error) is outside text unless `Md`."""
    need = ", ".join(f if isinstance(f, Md) else md_code(f) for f in files)
    text = f"> **{MISSING_MARK}:** {what}. This section needs {need}, which the run folder does not hold"
    text += f" ({why if isinstance(why, Md) else md_text(why)})." if why else "."
    return text + "\n"


_SECTION_RE = re.compile(r"^## (?!\d+\. )", re.M)


def number_sections(md: str) -> str:
    """Number the `## ` sections 1, 2, ... in the order they appear: a section that is present
    only for some runs (the step under load) takes its place without a gap or a stray title."""
    n = iter(range(1, 1000))
    return _SECTION_RE.sub(lambda _: f"## {next(n)}. ", md)


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

FIGURE_MAX_BYTES = 20 * 1024 * 1024
"""The largest figure file the HTML embeds (stepscope's own figures are under 1 MB)."""
FIGURE_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}
"""The figure files the HTML embeds, by suffix: the formats stepscope saves figures in."""
_FIGURE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
"""The page may show its own inline images and styles and nothing else: no script runs, nothing
is fetched, even if a tag got through."""


def _full_unescape(s: str) -> str:
    """`s` with HTML entities decoded until none is left (`&amp;#106;` is a `j` after two)."""
    while (u := html.unescape(s)) != s:
        s = u
    return s


def _local_target(src: str) -> bool:
    """Whether `src` is a path below the page's folder or beside it: no scheme, not absolute,
    no backslash. A browser drops tabs and newlines from URLs, so they are dropped before the
    check, and a colon before the first `/`, `?` or `#` is a scheme."""
    s = re.sub(r"[\x00-\x20\x7f]", "", src)
    head = re.split(r"[/?#]", s, maxsplit=1)[0]
    return bool(s) and not s.startswith(("/", "\\")) and "\\" not in s and ":" not in head


_STAGE_SIBLING = re.compile(r"\.\./\d\d_[a-z_]+/")
"""A report's link to a file of another stage of its run (`../05_categorize/perfetto/...`): the
one folder a link may climb, as a stage's page sits one folder below the run's root."""


def link_allowed(href: str) -> bool:
    """A link the HTML keeps: http(s), a fragment, or a relative path that climbs no folder
    (no `..`) but to a sibling stage's folder (`../05_categorize/...`); javascript:, data:, file:,
    mailto: and absolute paths are shown as text."""
    s = _full_unescape(href).strip()
    if re.match(r"(?i)https?://[^\s]", s):
        return True
    if m := _STAGE_SIBLING.match(s):
        s = s[m.end():]
    return _local_target(s) and ".." not in re.split(r"[/?#]", s.split("#")[0])


def embed_figure(src: str, base_dir: Path, figure_dirs: Sequence[Path]) -> tuple[str | None, str]:
    """(data URI, "") for a figure the page may embed, else (None, why not): a relative path from
    `base_dir` to a regular .png or .svg file directly in one of `figure_dirs` (after symlinks),
    named as stepscope names figures, at most `FIGURE_MAX_BYTES`."""
    s = _full_unescape(src).strip()
    if not _local_target(s):
        return None, "refused: not a relative path to a figure"
    p = (base_dir / s).resolve()
    if not any(p.parent == Path(d).resolve() for d in figure_dirs):
        return None, "refused: not in the run's figures folder"
    if p.suffix.lower() not in FIGURE_TYPES or not _FIGURE_NAME_RE.fullmatch(p.name):
        return None, "refused: not a figure's name"
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            return None, "refused: not a regular file"
        if st.st_size > FIGURE_MAX_BYTES:
            return None, f"refused: over {FIGURE_MAX_BYTES // 2**20} MiB"
        with p.open("rb") as f:
            data = f.read(FIGURE_MAX_BYTES + 1)
    except OSError:
        return None, "not found"
    if len(data) > FIGURE_MAX_BYTES:
        return None, f"refused: over {FIGURE_MAX_BYTES // 2**20} MiB"
    return f"data:{FIGURE_TYPES[p.suffix.lower()]};base64,{base64.b64encode(data).decode('ascii')}", ""


class _SafeTargets(Treeprocessor):
    """Every link and image the Markdown made, checked after all else: a link stepscope does not
    allow becomes its text, an image it may not embed becomes a visible note."""

    def __init__(self, md: md_lib.Markdown, base_dir: Path, figure_dirs: Sequence[Path]):
        super().__init__(md)
        self.base_dir, self.figure_dirs = base_dir, figure_dirs

    def run(self, root: etree.Element) -> None:
        for el in root.iter():
            if el.tag == "a" and not link_allowed(el.get("href", "")):
                el.tag = "span"
                el.attrib.clear()
            elif el.tag == "img":
                src = el.get("src", "")
                uri, why = embed_figure(src, self.base_dir, self.figure_dirs)
                if uri is not None:
                    el.set("src", uri)
                    continue
                el.tag, el.text = "span", f"[image {why}: {one_line(src)[:200]}]"
                el.attrib.clear()
                el.set("class", "missing-image")


def _markdown(base_dir: Path, figure_dirs: Sequence[Path]) -> md_lib.Markdown:
    """Python-Markdown with raw HTML off (any `<` in the text comes out as text) and every
    link and image checked (`_SafeTargets`)."""
    m = md_lib.Markdown(extensions=["tables", "fenced_code", "toc", "sane_lists"],
                        extension_configs={"toc": {"toc_depth": "2-3"}}, output_format="html")
    m.preprocessors.deregister("html_block")
    m.inlinePatterns.deregister("html")
    m.treeprocessors.register(_SafeTargets(m, base_dir, figure_dirs), "stepscope_safe_targets", -10)
    return m


def markdown_to_html(md_text: str, base_dir: Path, title: str, figure_dirs: Sequence[Path] = ()) -> str:
    """Render markdown to one self-contained HTML page. Only figures directly in `figure_dirs` (default
    `base_dir`/figures) are embedded, other images become a note; raw HTML shows as text, links are
    `link_allowed`, and the Content-Security-Policy forbids scripts and requests."""
    body = _markdown(base_dir, figure_dirs or (base_dir / "figures",)).convert(md_text)
    body = re.sub(r"<blockquote>(\s*<p><strong>" + re.escape(MISSING_MARK) + ")",
                  r'<blockquote class="missing">\1', body)
    body = re.sub(r"<blockquote>(\s*<p><strong>(Verdict|In short))", r'<blockquote class="verdict">\1', body)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">\n'
            f"<title>{html.escape(one_line(title))}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n"
            "</body>\n</html>\n")
