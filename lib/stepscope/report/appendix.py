"""`06_writeup/appendix.md` and `.html`: the run's provenance (command lines, stages, packages,
the params file, every file in the run folder), kept out of the report a reader reads first."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import yaml
from markdown.extensions.toc import slugify

from stepscope.config import redact, redact_argv, redact_params_text
from stepscope.redaction import scrub
from stepscope.report.artifacts import RunArtifacts
from stepscope.report.markdown_util import kv_table, markdown_to_html, md_table, missing_box
from stepscope.schema.writeup import APPENDIX_HTML, APPENDIX_MD, REPORT_HTML, REPORT_MD
from stepscope.wording import md_fence, md_text


def appendix_link(heading: str, text: str = "appendix") -> str:
    """A link from report.md to one appendix table by its `### ` heading's id (as both the HTML and
    GitHub give it)."""
    return f"[{text}]({APPENDIX_MD}#{slugify(heading, '-')})"


def appendix_table(heading: str, body: str) -> str:
    """One table of "Measurements in full" under its `### ` heading (`appendix_link` points at it);
    '' without a body."""
    return f"### {heading}\n\n{body}" if body.strip() else ""


def appendix_markdown(a: RunArtifacts, title: str, tables: str = "") -> str:
    """The appendix as markdown, secrets redacted from argv and params; `tables` (markdown) holds
    the measurements the report shows as figures or summaries, in full."""
    text = (f"# Appendix: {md_text(title)}\n\nThe measurements behind [the report]({REPORT_MD})'s figures in full, "
            "and the run's provenance.\n\n")
    if tables:
        text += "## Measurements in full\n\n" + tables + "\n"
    text += "## Command lines\n\n"
    run, server = a.run, a.server
    cmds = []
    if run is not None and run.argv:
        cmds.append(("stepscope", " ".join(redact_argv(run.argv))))
    if server is not None and server.argv:
        cmds.append(("server", " ".join(redact_argv(server.argv))))
    for who, line in cmds:
        text += f"{who}:\n\n{md_fence(line)}\n"
    if not cmds:
        text += missing_box("Command lines", ["run.json (argv)", "00_deploy/server.json (argv)"])
    if run is not None and run.stages:
        rows = [{"stage": k, "status": v.status, "duration_s": v.duration_s, "error": v.error or ""}
                for k, v in run.stages.items()]
        text += "\n## Stages\n\n" + md_table(pd.DataFrame(rows))
    if run is not None and run.packages:
        text += "\n## Packages\n\n" + kv_table(sorted(run.packages.items()), ("package", "version"))
    text += "\n## Params file\n\n" + _params_block(a)
    return text + "\n## Files in the run folder\n\n" + md_table(file_manifest(a.run_dir),
                                                                 [("path", "path"), ("bytes", "bytes")])


def _params_block(a: RunArtifacts) -> str:
    if a.params_text is None:
        return missing_box("The params snapshot", ["params.yaml"])
    try:
        safe = yaml.safe_dump(redact(yaml.safe_load(a.params_text)), sort_keys=False)
    except yaml.YAMLError:
        # Unparsable text is still shown, but never with a secret in it.
        safe = redact_params_text(a.params_text)
    return md_fence(safe, "yaml")


def file_manifest(run_dir: Path, collapse: tuple[str, ...] = ("cache", "perfetto", "traces", "levels")) -> pd.DataFrame:
    """Every file under the run folder with its size; bulky folders collapse into one row each."""
    rows = []
    for root, dirs, files in os.walk(run_dir):
        dirs.sort()
        rel_root = Path(root).relative_to(run_dir)
        if rel_root.name in collapse and rel_root != Path("."):
            total, count = 0, 0
            for r2, _, f2 in os.walk(root):
                for f in f2:
                    total += (Path(r2) / f).stat().st_size
                    count += 1
            rows.append({"path": f"{rel_root.as_posix()}/ ({count} files)", "bytes": total})
            dirs[:] = []
            continue
        for f in sorted(files):
            if f.startswith("."):
                continue
            rows.append({"path": (rel_root / f).as_posix(), "bytes": (Path(root) / f).stat().st_size})
    return pd.DataFrame(rows, columns=["path", "bytes"])


def write_appendix(a: RunArtifacts, out_dir: Path, title: str, tables: str = "") -> tuple[Path, Path]:
    """Write appendix.md and appendix.html into `out_dir` through the report's secret filter and
    HTML pipeline; return their paths. Written after report.md, so the file list names it."""
    text = appendix_markdown(a, title, tables)
    md_path, html_path = out_dir / APPENDIX_MD, out_dir / APPENDIX_HTML
    md_path.write_text(scrub(text))
    html = markdown_to_html(scrub(text.replace(f"]({REPORT_MD})", f"]({REPORT_HTML})")), out_dir, f"Appendix: {title}",
                            figure_dirs=(a.run_dir / "figures",))
    html_path.write_text(scrub(html))
    return md_path, html_path
