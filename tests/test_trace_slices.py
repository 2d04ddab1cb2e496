"""Issue 26: stage 05 reads its largest arrays a slice at a time and lets the device rows of
the event table go once the work table holds them. Neither may change a number: the results
with tiny slices, and with the table let go, equal those of one pass over the whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepscope.trace import account, steps
from stepscope.trace import codes as trace_codes
from stepscope.trace.analyze import analyze_rank
from stepscope.trace.categorize import make_rules
from stepscope.trace.load import load_rank

# a vLLM-style GPU decode step, a training trace with NCCL, an SGLang decode of many steps
TRACES = ["tracelens-b200-gptoss-tp8-rank0.json.gz", "hta-a100-ddp-nccl.json.gz",
          "sglang-mi300x-qwen3-8b-decode.json.gz"]


def _union_reference(codes, s, e, n):
    """Union length per code, one interval at a time in start order (each merged segment's
    length added as it closes, in order: the same sums, so equal to the last bit)."""
    out = np.zeros(n)
    for code in range(n):
        rows = [(a, b) for c, a, b in zip(codes, s, e) if c == code]
        rows.sort(key=lambda r: r[0])  # stable: keeps the given order on ties
        seg = None
        for a, b in rows:
            if seg is not None and a <= seg[1]:
                seg[1] = max(seg[1], b)
                continue
            if seg is not None:
                out[code] += seg[1] - seg[0]
            seg = [a, b]
        if seg is not None:
            out[code] += seg[1] - seg[0]
    return out


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 16])
def test_union_by_code_in_slices_equals_one_pass(monkeypatch, chunk):
    monkeypatch.setattr(account, "UNION_CHUNK_ROWS", chunk)
    rng = np.random.default_rng(chunk)
    for _ in range(200):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 4))
        codes = rng.integers(0, k, n)
        s = np.round(rng.random(n) * 50, 1)
        o = np.lexsort((s, codes)) if rng.random() < 0.5 else np.argsort(s, kind="stable")
        codes, s = codes[o], s[o]
        e = s + np.round(rng.random(n) * rng.choice([1.0, 10.0]), 1)
        mask = rng.random(n) < 0.6
        got = account._union_by_code(codes, s, e, k, mask)
        want = _union_reference(codes[mask], s[mask], e[mask], k)
        assert np.array_equal(got, want), (codes, s, e, mask)
        assert np.array_equal(account._union_by_code(codes, s, e, k), _union_reference(codes, s, e, k))


def test_a_segment_open_across_slices_is_counted_once(monkeypatch):
    monkeypatch.setattr(account, "UNION_CHUNK_ROWS", 2)
    # one long interval covering the next four, then a gap, then one more: 10 + 3
    s = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 20.0])
    e = np.array([10.0, 2.0, 3.0, 4.0, 9.0, 23.0])
    assert account._union_by_code(np.zeros(6, int), s, e, 1).tolist() == [13.0]


def _tables(r) -> dict[str, pd.DataFrame]:
    return {"work": r.work, "step_categories": r.step_categories, "rank_categories": r.rank_categories,
            "steps_tot": r.steps_tot, "kernels": r.kernels, "levers": r.levers, "modules": r.modules,
            "collective_sizes": r.collective_sizes}


@pytest.mark.parametrize("name", TRACES)
def test_tiny_slices_and_a_consumed_table_change_no_number(real_traces: Path, monkeypatch, name):
    rules = make_rules()
    whole = analyze_rank(load_rank(real_traces / name, allow_no_rank=True), rules)
    monkeypatch.setattr(account, "UNION_CHUNK_ROWS", 5)
    monkeypatch.setattr(steps, "ENCLOSING_CHUNK_ROWS", 3)
    monkeypatch.setattr(trace_codes, "FACTORIZE_CHUNK_ROWS", 4)
    rt = load_rank(real_traces / name, allow_no_rank=True)
    sliced = analyze_rank(rt, rules, consume=True)
    assert rt.events is None  # let go: stage 05 keeps no second copy of the device rows
    assert len(whole.work) > 500
    for key, table in _tables(whole).items():
        pd.testing.assert_frame_equal(_tables(sliced)[key], table, check_exact=True, obj=key)
    assert sliced.totals == whole.totals and sliced.info == whole.info


def _launch_delays_reference(w: pd.DataFrame, step_ids) -> list[float]:
    """Per launch, its first kernel in start order among the rows of `step_ids` (every row
    when None): start minus the launch's start."""
    keep = True if step_ids is None else w["step_id"].isin(step_ids)
    w = w.assign(keep=keep).sort_values("start_us", kind="stable")
    w = w[w["keep"] & w["launch_us"].notna() & (w["correlation"] >= 0)]
    first = w.drop_duplicates("correlation")
    return sorted((first["start_us"] - first["launch_us"]).tolist())


@pytest.mark.parametrize("chunk", [1, 3, 1 << 16])
@pytest.mark.parametrize("id_scale", [1, 10 ** 9])  # ids about as many as the rows, and sparse ones
def test_launch_firsts_in_slices_give_each_launchs_first_kernel(monkeypatch, chunk, id_scale):
    """The launch table, built a slice at a time, gives the launch delays of the kernel rows
    themselves: per launch, its first kernel in start order, over any set of steps."""
    from stepscope.trace.period import _launch_delay_by_step, launch_delays
    from stepscope.trace.steps import launch_firsts

    monkeypatch.setattr(steps, "ENCLOSING_CHUNK_ROWS", chunk)
    rng = np.random.default_rng(chunk + id_scale)
    for _ in range(100):
        n = int(rng.integers(0, 40))
        start = np.round(rng.random(n) * 50, 1)
        if rng.random() < 0.7:
            start.sort()  # as most traces' kernels come
        corr = rng.integers(-1, 8, n)
        launch_us = rng.random(8) * 50 - 1  # one start per launch
        launch_of = np.where((rng.random(n) < 0.2) | (corr < 0), -1, corr)  # -1: the launch is not in the trace
        w = pd.DataFrame({"start_us": start, "step_id": rng.integers(-1, 4, n).astype(np.int32),
                          "launch_us": np.where(launch_of >= 0, launch_us[launch_of], np.nan),
                          "correlation": (corr * id_scale).astype(np.int64)})
        table = launch_firsts(start, w["step_id"].to_numpy(), w["correlation"].to_numpy(), launch_of, launch_us)
        assert not table.duplicated(["step_id", "correlation"]).any()
        for ids in (None, np.array([0, 2]), np.array([1])):
            assert sorted(launch_delays(table, ids).tolist()) == _launch_delays_reference(w, ids)
        by_step = _launch_delay_by_step(table)
        for sid in range(4):
            ref = _launch_delays_reference(w, [sid])
            assert by_step.get(sid) == (float(np.median(ref)) if ref else None)


def test_steps_as_runs_are_the_groups_of_a_groupby():
    from stepscope.trace.period import _by_step

    rng = np.random.default_rng(3)
    for _ in range(200):
        runs = rng.integers(1, 5, int(rng.integers(0, 8)))
        sid = np.repeat(rng.permutation(len(runs)), runs)  # each step one run
        if rng.random() < 0.4 and len(sid) > 2:  # steps that overlap: a step in two runs
            sid = rng.permutation(sid)
        att = pd.DataFrame({"step_id": sid.astype(np.int32), "start_us": np.arange(len(sid), dtype=float)})
        got = {k: w["start_us"].tolist() for k, w in _by_step(att)}
        want = {int(k): w["start_us"].tolist() for k, w in att.groupby("step_id", sort=False)}
        assert got == want and list(got) == list(want)


@pytest.mark.parametrize("chunk", [1, 3, 1 << 16])
def test_factorizing_keys_in_slices_equals_pandas(monkeypatch, chunk):
    monkeypatch.setattr(trace_codes, "FACTORIZE_CHUNK_ROWS", chunk)
    rng = np.random.default_rng(chunk)
    for _ in range(100):
        keys = rng.integers(-3, int(rng.integers(1, 30)), int(rng.integers(0, 60))) * 1_000_003
        codes, uniq = trace_codes.factorize_keys(len(keys), lambda s: keys[s])
        want_codes, want_uniq = pd.factorize(keys)  # first appearance order
        assert codes.dtype == np.int32
        assert codes.tolist() == want_codes.tolist() and uniq.tolist() == want_uniq.tolist()
        # the same keys with no code per row: the distinct ones, then each row's value by key
        first = trace_codes.first_keys(len(keys), lambda s: keys[s])
        assert first.tolist() == want_uniq.tolist()
        values = (np.arange(len(first)) * 7 - 5).astype(np.int16)
        got = trace_codes.lookup_keys(len(keys), lambda s: keys[s], first, values)
        assert got.dtype == np.int16 and got.tolist() == values[want_codes].tolist()


def test_map_codes_is_remove_unused_then_sorted_and_judges_each_value_once():
    from stepscope.trace.codes import map_codes

    rng = np.random.default_rng(7)
    for _ in range(300):
        cats = list(dict.fromkeys(rng.choice(list("qwertyuiop"), int(rng.integers(1, 8)))))
        codes = rng.integers(-1, len(cats), int(rng.integers(0, 30)))
        c = pd.Categorical.from_codes(codes, categories=cats)
        want = c.remove_unused_categories()
        want = want.reorder_categories(sorted(want.categories))
        got = map_codes(c)
        assert list(got.categories) == list(want.categories) and got.codes.tolist() == want.codes.tolist()
    c = pd.Categorical(["b", "a", None, "b", "c"])
    seen = []
    upper = map_codes(c, lambda x: seen.append(x) or ("X" if x == "c" else x.upper()), missing="Z")
    assert sorted(seen) == ["a", "b", "c"]  # once per used value, not per row
    assert list(upper) == ["B", "A", "Z", "B", "X"] and list(upper.categories) == ["A", "B", "X", "Z"]
    only_a = map_codes(c, {"a": "p"}.get)  # a None value is missing
    assert only_a.isna().tolist() == [True, False, True, True, True] and list(only_a.categories) == ["p"]


@pytest.mark.parametrize("name", TRACES)
def test_a_one_kernel_category_reads_the_same_sum_as_lever_and_as_kernel(real_traces: Path, name):
    # Both tables take their sums from one group sum per (category, name) (account._name_groups);
    # the levers once summed per category first and differed in the last bit (hta-a100-ddp-nccl).
    r = analyze_rank(load_rank(real_traces / name, allow_no_rank=True), make_rules())
    one = r.levers[r.levers["n_names"] == 1].set_index("category")["sum_ms_per_step"]
    kernels = r.kernels.set_index("category")["sum_ms_per_step"]
    assert len(one) >= 1
    for cat, ms in one.items():
        assert ms == kernels[cat], cat


def test_message_sizes_keep_the_table_width_and_read_text_as_ints():
    text = pd.DataFrame({"msg_nelems": pd.Series(["5", None, "x", "7"], dtype=object)})
    got = steps._nelems(text)[np.array([3, 0, 1])]
    assert got.dtype == np.int64 and got.tolist() == [7, 5, -1]  # unreadable or missing: -1
    narrow = pd.DataFrame({"msg_nelems": np.array([1, -1, 4096], dtype=np.int32)})
    assert steps._nelems(narrow)[np.array([2, 1])].dtype == np.int32  # no int64 copy per event
    assert steps._nelems(pd.DataFrame({"x": [1, 2]})).tolist() == [-1, -1]


@pytest.mark.parametrize("chunk", [1, 3, 1 << 16])
def test_device_rows_gathered_in_place_equal_a_take(monkeypatch, chunk):
    """An owned table's columns are gathered into their own front, a slice at a time: the same
    values, in order, as a take of the device rows, for numbers and codes alike."""
    from stepscope.trace.steps import DeviceRows

    monkeypatch.setattr(steps, "ENCLOSING_CHUNK_ROWS", chunk)
    rng = np.random.default_rng(chunk)
    for _ in range(50):
        n = int(rng.integers(0, 30))
        cats = rng.choice(["kernel", "cuda_runtime", "gpu_memcpy", "cpu_op"], n)
        ev = pd.DataFrame({"cat": pd.Categorical(cats), "ts": rng.random(n), "tid": rng.integers(-5, 9, n).astype(np.int32),
                           "name": pd.Categorical(rng.choice(list("abc"), n))})
        want = ev[ev["cat"].isin(["kernel", "gpu_memcpy"])].reset_index(drop=True)
        dev = DeviceRows(ev, own=True)
        for col in ("ts", "tid", "name", "cat"):
            got = dev.take(col)
            assert list(got) == want[col].tolist() and col not in ev


def test_ints_are_held_in_the_narrowest_width_that_holds_them():
    from stepscope.trace.widths import int_width, narrow_ints

    assert [int_width(lo, hi) for lo, hi in [(-1, 127), (-1, 128), (-32769, 0), (0, 2**31)]] == [
        np.int8, np.int16, np.int32, np.int64]
    got = narrow_ints(np.array([-1, 7, 300], dtype=np.int64))
    assert got.dtype == np.int16 and got.tolist() == [-1, 7, 300]
    assert narrow_ints(np.array([], dtype=np.int32)).dtype == np.int32  # no values: as it was
    floats = np.array([1.5])
    assert narrow_ints(floats) is floats


@pytest.mark.parametrize("by_mask", [16, 0])  # each group through a mask; one sort of every row
def test_group_medians_are_pandas_groupby_medians_to_the_bit(monkeypatch, by_mask):
    monkeypatch.setattr(trace_codes, "MEDIAN_GROUPS_BY_MASK", by_mask)
    rng = np.random.default_rng(7)
    for trial in range(200):
        n, rows = int(rng.integers(1, 6)), int(rng.integers(1, 60))
        codes = rng.integers(0, n, rows).astype(np.int8)
        values = rng.random(rows) * [1e-3, 1.0, 1e6][trial % 3]
        if trial % 5 == 0:
            values[rng.integers(0, rows)] = np.nan  # skipped, as pandas skips it
        groups = pd.Categorical.from_codes(codes, categories=pd.RangeIndex(n))
        want = pd.Series(values).groupby(groups, observed=False).median().to_numpy()
        np.testing.assert_array_equal(trace_codes.group_medians(codes, values, n), want)


def test_value_counts_of_codes_equal_pandas_in_order():
    col = pd.Series(pd.Categorical(["b", "a", "b", "c", None, "a", "b"], categories=["a", "b", "c", "d"]))
    assert list(trace_codes.value_counts(col).items()) == list(col.value_counts().items())
    plain = pd.Series(["x", "y", "x"])
    assert trace_codes.value_counts(plain).to_dict() == {"x": 2, "y": 1}


def test_rows_picked_through_a_mask_equal_loc_on_a_fresh_index():
    rng = np.random.default_rng(3)
    work = pd.DataFrame({"name": pd.Categorical(rng.choice(list("abc"), 50)), "dur_us": rng.random(50),
                         "step_id": rng.integers(-1, 4, 50).astype(np.int16),
                         "count": pd.array(rng.integers(0, 9, 50), dtype="Int64")})
    mask = rng.random(50) < 0.4
    got = account.rows_of(work, mask, ["name", "dur_us", "step_id", "count", "absent"])
    want = work.loc[mask, ["name", "dur_us", "step_id", "count"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)
    assert account.rows_of(work, np.ones(50, bool), ["dur_us"])["dur_us"] is not None


@pytest.mark.parametrize("keys", [["category", "name"], ["category"]])
def test_main_module_through_codes_equals_the_pandas_groupby(keys):
    """Per group, the module holding most of its time and that share, as a groupby of the text
    columns says it (durations in whole µs: every order of addition gives the same sums)."""
    rng = np.random.default_rng(len(keys))
    for _ in range(100):
        n = int(rng.integers(1, 80))
        w = pd.DataFrame({"category": pd.Categorical(rng.choice(list("abc"), n)),
                          "name": pd.Categorical(rng.choice(list("xyzw"), n)),
                          "module_path": pd.Categorical(rng.choice(["m1", "m2", None, "m3"], n),
                                                        categories=["m1", "m2", "m3", "m9"]),
                          "dur_us": rng.integers(1, 50, n).astype(float)})
        if not w["module_path"].notna().any():
            continue
        by = w.groupby(keys + ["module_path"], sort=False, observed=True)["dur_us"].sum().reset_index()
        tot = w.groupby(keys, sort=False, observed=True)["dur_us"].sum().rename("tot").reset_index()
        by = by.sort_values("dur_us", ascending=False, kind="stable").drop_duplicates(keys).merge(tot, on=keys)
        want = pd.DataFrame({**{k: by[k] for k in keys}, "module": by["module_path"],
                             "module_share": by["dur_us"] / by["tot"]})
        pd.testing.assert_frame_equal(account._main_module(w, keys), want)
