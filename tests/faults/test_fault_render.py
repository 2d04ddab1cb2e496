"""Issue 39, items 1-4: nothing a trace, a params file or a server says runs in a report.

The third probe's payloads are placed where outside text reaches the reports: a kernel name
(stage 05's category_kernels.csv), a flag's message and the "other" names (summary.json),
each params string the setup table shows, the served model, and a sweep failure's error body
(01_macro_sweep/summary.json). report.md, report.html, compare.html and the campaign report
are read as text (fast) and opened in headless Chromium (slow): no tag forms, no script runs,
no link goes to javascript:, and no file outside the run folder is read or requested.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from stepscope import schema
from stepscope.campaign.report import build_campaign_report
from stepscope.report.build import build_report
from stepscope.report.compare import compare_runs
from stepscope.report.markdown_util import FIGURE_MAX_BYTES, markdown_to_html
from stepscope.testing.synthetic import make_synthetic_run
from stepscope.wording import figure_text, md_code, md_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/browser.py
from browser import CHROMIUM, run_browser  # noqa: E402

PWN = "window.pwned=1;document.title='PWNED'"
PAYLOADS = (f"`<img src=x onerror=\"{PWN}\">`", f"[x](javascript:{PWN})", '<img src="/etc/passwd">',
            '<img src="/dev/zero">', f"<svg onload=\"{PWN}\">", f"<script>{PWN}</script>",
            "![p](/etc/passwd)")
"""The probe's payloads; the last, Markdown's own image syntax, is the same file read another way."""
ALL = " ".join(PAYLOADS)


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _poison_trace(run: Path) -> None:
    """A kernel name, an "other" name and a flag message holding every payload."""
    d = run / "05_categorize"
    rows = [{"rank": 0, "category": c, "class": k, "name": f"{p} void at::native::vectorized_elementwise_kernel<4, float>",
             "n_steps": 155, "count": 155, "calls_per_step": 1.0, "sum_ms_per_step": 1.0 - i / 10,
             "us_per_call": 1000.0, "share_of_category": 0.5, "n_names": 3}
            for c, k in (("all_reduce", "communication"), ("quant_gemm", "compute")) for i, p in enumerate(PAYLOADS)]
    rows.append({**rows[0], "name": "aten::mm", "sum_ms_per_step": 2.0})
    schema.write_table(pd.DataFrame(rows), d / "category_kernels.csv", schema.CategoryKernelRow)

    def edit(s: dict) -> None:
        s["ranks"][0]["other_top_names"][0]["name"] = ALL
        s["flags"].append({"code": "rank_unreadable", "severity": "warning", "message": f"rank 9: {ALL}"})
    _edit_json(d / "summary.json", edit)


def _poison_params_and_server(run: Path) -> None:
    """Each params string the report shows, the served model, and a sweep failure's error body."""
    p = yaml.safe_load((run / "params.yaml").read_text())
    p["writeup"]["title"] = f"Title {ALL}"
    p["hardware"].update(name=f"hw {ALL}", interconnect=f"link {ALL}")
    p["model"].update(served_name=f"served {ALL}", quantization=f"quant {ALL}")
    (run / "params.yaml").write_text(yaml.safe_dump(p))
    _edit_json(run / "00_deploy" / "server.json", lambda s: s.update(served_model=None))
    _edit_json(run / "01_macro_sweep" / "summary.json", lambda s: s.update(
        n_failures=2, failures=[{"level": "c0001", "http_status": 500, "error": f"<html>{ALL}</html>"}]))


def hostile_run(run: Path) -> Path:
    make_synthetic_run(run)
    _poison_trace(run)
    _poison_params_and_server(run)
    return run


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    """report.md/html of a hostile run, compare.md/html of it against a clean one, and a
    campaign report over both."""
    root = tmp_path_factory.mktemp("render")
    bad = hostile_run(root / "camp" / "bad")
    good = make_synthetic_run(root / "camp" / "good", scale=0.8)
    kernels = pd.read_csv(bad / "05_categorize" / "category_kernels.csv").head(2).assign(name=["aten::mm", "k2"])
    schema.write_table(kernels, good / "05_categorize" / "category_kernels.csv", schema.CategoryKernelRow)
    paths = build_report(bad, draw_figures=False)
    cmp = compare_runs(good, bad)
    runs = [{"key": f"{n}#1", "variant": n, "repeat": 1, "run_dir": n, "status": "ok", "reused": {},
             "description": f"{n} {ALL}"} for n in ("good", "bad")]
    schema.write(root / "camp" / "campaign.json", {"campaign_id": "camp", "baseline": "good",
                                                   "variants": ["good", "bad"], "repeats": 1, "wall_s": 1.0,
                                                   "runs": runs}, schema.CampaignRecord)
    camp = build_campaign_report(root / "camp")
    return {"report.md": paths["markdown"], "report.html": paths["html"], "compare.md": cmp["markdown"],
            "appendix.md": paths["appendix_markdown"], "appendix.html": paths["appendix_html"],
            "compare.html": cmp["html"], "campaign.md": camp["markdown"], "campaign.html": camp["html"]}


def live_markup(html_or_md: str) -> list[str]:
    """The tags in a page that could run or fetch: any <script> or <svg>, any attribute that is
    an event handler, an <img> whose src is not an inlined figure, a javascript: href. Escaped
    text (`&lt;img ... onerror=`) is no tag, and is not listed."""
    bad = []
    for m in re.finditer(r"<\s*([a-zA-Z][\w-]*)([^>]*)>", html_or_md):
        tag, attrs = m.group(1).lower(), m.group(2)
        if (tag in ("script", "svg", "iframe", "object", "embed") or re.search(r"\son\w+\s*=", attrs)
                or (tag == "img" and not re.search(r'src="data:image/(png|svg\+xml);base64,', attrs))
                or re.search(r"href\s*=\s*[\"']?\s*javascript:", attrs, re.I)):
            bad.append(m.group(0)[:120])
    return bad


def _outside_code(md: str) -> str:
    """report.md without its code spans and fences (where a `<` is text to every renderer)."""
    md = re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1\s*$", "", md)
    return re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", "", md)


def _passwd_fragments() -> list[str]:
    data = Path("/etc/passwd").read_bytes()[:300]
    return [base64.b64encode(data[i:i + 60]).decode()[4:40] for i in (0, 3, 6)]


@pytest.mark.timeout(120)  # /dev/zero once read until memory ran out
@pytest.mark.parametrize("name", ["report.html", "appendix.html", "compare.html", "campaign.html"])
def test_no_payload_forms_a_tag_a_script_link_or_an_embedded_file_in_the_html(reports, name):
    page = reports[name].read_text()
    assert "window.pwned" in page, "the payloads did not reach the page: the test would prove nothing"
    assert live_markup(page) == []
    assert not any(f in page for f in _passwd_fragments()), "/etc/passwd is embedded"
    assert 'http-equiv="Content-Security-Policy"' in page and "default-src 'none'" in page
    # every image the page holds is one of stepscope's figures, inlined
    assert all(src.startswith("data:image/") for src in re.findall(r'<img[^>]*src="([^"]*)"', page))


@pytest.mark.parametrize("name", ["report.md", "appendix.md", "compare.md", "campaign.md"])
def test_no_payload_forms_a_tag_or_link_in_the_markdown(reports, name):
    md = reports[name].read_text()
    assert "pwned" in md
    bare = _outside_code(md)
    assert live_markup(bare) == [] and "<html>" not in bare
    # a link or image needs an unescaped "](": each one left is stepscope's own figure
    assert re.findall(r"(?<!\\)\]\(\s*javascript:", bare) == []
    assert [x for x in re.findall(r"(?<!\\)\]\(([^)]*)\)", bare) if not re.fullmatch(r"(\.\./)?figures/\w+\.png|compare_\w+\.png|appendix\.md(#[\w-]+)?|report\.md", x)] == []


def test_names_still_read_as_written(reports):
    md, page = reports["report.md"].read_text(), reports["report.html"].read_text()
    # the largest kernels' table is the appendix's (issue 37): the names read as written there
    appendix, appendix_page = reports["appendix.md"].read_text(), reports["appendix.html"].read_text()
    assert "`aten::mm`" in appendix and "<code>aten::mm</code>" in appendix_page
    # a template kernel's name is text in a code span: `<4, float>` is shown, not swallowed as a tag
    assert "vectorized_elementwise_kernel&lt;4, float&gt;" in appendix_page
    # the backtick payload stays inside its code span: the span's fence is longer than its run
    assert "<code>`&lt;img src=x onerror=" in page
    assert "| Hardware | hw `&lt;img src=x onerror=" not in md and "| Hardware | hw \\`&lt;img src=x" in md


@pytest.mark.parametrize("text", ['<img src="/etc/passwd">', "![p](/etc/passwd)", "![p](../../../../etc/passwd)",
                                  "![z](/dev/zero)", '<img src="x" onerror="alert(1)">'])
def test_the_html_step_alone_embeds_only_the_runs_figures(tmp_path, text):
    # markdown_to_html is the last line: even Markdown no escape saw cannot read a file
    (tmp_path / "figures").mkdir()
    page = markdown_to_html(f"# t\n\n{text}\n", tmp_path, "t")
    assert live_markup(page) == []
    assert "<img" not in page and "data:" not in page.split("</head>")[1]
    assert "[image refused" in page or "&lt;img" in page


def test_figures_are_embedded_only_from_the_figures_folder_and_under_the_cap(tmp_path):
    figs = tmp_path / "figures"
    figs.mkdir()
    (figs / "ok.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (tmp_path / "beside.png").write_bytes(b"\x89PNG beside")
    (figs / "big.png").write_bytes(b"\0" * (FIGURE_MAX_BYTES + 1))
    (figs / "link.png").symlink_to("/etc/passwd")
    (figs / "notes.txt").write_text("x")
    md = "\n\n".join(f"![{n}]({p})" for n, p in (("ok", "figures/ok.png"), ("beside", "beside.png"),
                                                ("big", "figures/big.png"), ("link", "figures/link.png"),
                                                ("txt", "figures/notes.txt"), ("gone", "figures/gone.png")))
    page = markdown_to_html(md, tmp_path, "t")
    assert page.count('src="data:image/png;base64,') == 1
    assert base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode() in page
    for note in ("[image refused: not in the run&#x27;s figures folder: beside.png]",
                 f"[image refused: over {FIGURE_MAX_BYTES // 2**20} MiB: figures/big.png]",
                 "[image refused: not in the run&#x27;s figures folder: figures/link.png]",
                 "[image refused: not a figure&#x27;s name: figures/notes.txt]",
                 "[image not found: figures/gone.png]"):
        assert note in page or note.replace("&#x27;", "'") in page, note


@pytest.mark.parametrize("href,kept", [("https://example.org/a?b=1&c=2", True), ("#setup", True),
                                       ("levels.csv", True), ("javascript:alert(1)", False),
                                       ("jav&#x61;script:alert(1)", False), ("java\tscript:alert(1)", False),
                                       ("data:text/html,x", False), ("file:///etc/passwd", False),
                                       ("/etc/passwd", False), ("//evil.example", False), ("../../x", False),
                                       ("../05_categorize/perfetto/ranks.merged.json.gz", True),
                                       ("../05_categorize/../../x", False), ("../x/y", False),
                                       ("../05_categorize/javascript:x", False), ("mailto:a@b.c", False)])
def test_links_are_http_or_relative(tmp_path, href, kept):
    page = markdown_to_html(f"[here]({href})\n", tmp_path, "t")
    assert ("<a href=" in page) is kept, page.split("<body>")[1]
    assert "here" in page


def test_escaping_helpers_say_what_they_keep():
    assert md_text("a<b>&c [x](y) `z` *e* _f_ all_reduce") == (
        "a&lt;b&gt;&amp;c [x\\](y) \\`z\\` \\*e\\* \\_f\\_ all_reduce")
    assert md_text("# h") == "\\# h" and md_text("1. x") == "1\\. x" and md_text("0.800×") == "0.800×"
    assert md_code("a`b") == "``a`b``" and md_code("`a") == "`` `a ``" and md_code("a\nb") == "`a b`"
    assert figure_text("cost $x$ a") == "cost \\$x\\$ a"


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (setup: apt-get install -y chromium)")
@pytest.mark.parametrize("name", ["report.html", "appendix.html", "compare.html", "campaign.html"])
def test_chromium_runs_nothing_and_fetches_nothing_from_the_payloads(reports, name, tmp_path):
    expr = ("JSON.stringify({pwned: window.pwned || 0, title: document.title, "
            "links: Array.from(document.links).map(a => a.href).filter(h => !h.startsWith('file:') || "
            "!h.includes('#')), images: Array.from(document.images).map(i => i.src.slice(0, 15))})")
    state, requests = run_browser(reports[name], tmp_path, tmp_path / f"{name}.png", expr, settle_s=1.0)
    assert state["pwned"] == 0 and state["title"] != "PWNED", state
    assert not any(h.lower().startswith("javascript:") for h in state["links"]), state["links"]
    assert all(s.startswith("data:image/") for s in state["images"]), state["images"]
    page = reports[name].as_uri()
    assert [u for u in requests if u != page and not u.startswith("data:")] == []
