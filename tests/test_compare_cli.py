"""`stepscope compare` on the console: its own header, the files, and the comparison in one line."""

from __future__ import annotations

import pandas as pd

from stepscope.cli import main
from stepscope.testing.synthetic import make_synthetic_run
from stepscope.wording import fmt_num


def test_compare_ends_with_a_one_line_result(tmp_path, capsys):
    a = make_synthetic_run(tmp_path / "A")
    b = make_synthetic_run(tmp_path / "B", scale=0.8)  # every device time 0.8x, throughput 1.25x
    assert main(["compare", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"stepscope compare: A {a} against B {b}"
    out = b / "06_writeup" / "compare_vs_A"
    assert f"  markdown: {out / 'compare.md'}" in lines
    head = pd.read_csv(out / "compare_headlines.csv").set_index("metric").loc["decode step_ms (step period)"]
    macro = pd.read_csv(out / "compare_macro.csv")
    tput = macro[macro["metric"] == "output_throughput_tok_s"].iloc[-1]
    assert tput["level"] == "c=8" and (tput["a"], tput["b"]) == (300, 375)
    n_changed = sum(int(pd.read_csv(out / f"compare_{k}.csv")["flag"].eq("changed").sum())
                    for k in ("headlines", "macro", "decode_categories", "collectives"))
    assert lines[-1] == (f"B vs A: decode step {fmt_num(head['a'])} → {fmt_num(head['b'])} ms (0.800×), "
                         f"output tok/s at c=8 300 → 375 (1.25×); {n_changed} of 55 compared readings changed "
                         "beyond noise")
