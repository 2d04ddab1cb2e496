"""Kernel / op categories: the enclosing op or module first, the kernel's name second.

`rules.yaml` holds two ordered lists: `context:` rules name the purpose of a frame around a launch (the
innermost match decides), `rules:` match the kernel's name (first match wins; `catch_all` ones land in
`unattributed_elementwise`). Principles and the full list: docs/categories.md.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable

import numpy as np
import pandas as pd
import yaml

from stepscope.errors import ParamsError
from stepscope.trace.codes import FACTORIZE_CHUNK_ROWS, first_keys, lookup_keys, map_codes

logger = logging.getLogger(__name__)

CATCH_ALL_CATEGORY = "unattributed_elementwise"
"""Kernels only a catch-all rule matched: library elementwise work whose op is unknown."""

CATEGORY_CLASS: dict[str, str] = {
    "all_reduce": "communication",
    "all_gather": "communication",
    "all_to_all": "communication",
    "other_collective": "communication",
    "quant_gemm": "compute",
    "dense_gemm": "compute",
    "fused_moe": "compute",
    "moe_routing": "compute",
    "attention": "compute",
    "kv_cache_write": "compute",
    "norm": "compute",
    "activation": "compute",
    "rotary": "compute",
    "conv": "compute",
    "lm_head": "compute",
    "loss": "compute",
    "optimizer": "compute",
    "embedding": "compute",
    "quantize": "compute",
    "sampling": "compute",
    "elementwise": "compute",
    CATCH_ALL_CATEGORY: "compute",
    "framework": "compute",
    "other": "compute",
    "memcpy": "memory",
    "memset": "memory",
}
"""Every category and its class, for the class priority of exposed time (compute, communication, memory); the
categories are described in docs/categories.md."""

CATEGORIES: tuple[str, ...] = tuple(CATEGORY_CLASS)
COLLECTIVE_CATEGORIES = ("all_reduce", "all_gather", "all_to_all", "other_collective")
# A CPU wait on a collective is time spent in that collective: resolved per thread to
# the category of the collective op issued just before it.
WAIT_CATEGORY = "collective_wait"


@dataclass(frozen=True)
class Rule:
    """A name rule. `generic`: the name says only the work's class (`ncclDevKernel_Generic_2`), so an
    enclosing op of that class decides (`_context_applies`)."""

    category: str
    pattern: str
    cat: str | None = None
    catch_all: bool = False
    generic: bool = False

    @property
    def regex(self) -> re.Pattern:
        return _compile(self.pattern)


@dataclass(frozen=True)
class ContextRule:
    """A frame matching `pattern` (and `parent`, its enclosing module) gives its category to work launched
    inside it; with `only`, only to work whose name lands in those categories (an attention module names its
    softmax, not its projections' GEMMs)."""

    category: str
    pattern: str
    parent: str | None = None
    only: tuple[str, ...] | None = None

    @property
    def regex(self) -> re.Pattern:
        return _compile(self.pattern)

    @property
    def decision(self) -> str:
        """What the frame sweep records per frame: the category, and the name categories it may
        override after a `|` (`attention|elementwise,other`). `categorize_work` reads it back."""
        return self.category + ("|" + ",".join(self.only) if self.only else "")

    @property
    def parent_regex(self) -> re.Pattern:
        return _compile(self.parent or "")


@lru_cache(maxsize=None)
def _compile(pattern: str) -> re.Pattern:
    return re.compile(pattern)


@lru_cache(maxsize=1)
def _rules_yaml() -> dict:
    return yaml.safe_load(resources.files("stepscope.trace").joinpath("rules.yaml").read_text())


def builtin_rules() -> list[Rule]:
    """The packaged name rules, in order."""
    return [Rule(r["category"], r.get("pattern") or "", r.get("cat"), bool(r.get("catch_all")),
                 bool(r.get("generic"))) for r in _rules_yaml()["rules"]]


def context_rules() -> list[ContextRule]:
    """The packaged context rules, in order."""
    return [ContextRule(r["category"], r["pattern"], r.get("parent"),
                        tuple(r["only"]) if r.get("only") else None)
            for r in _rules_yaml().get("context", [])]


def make_rules(extra_rules: Iterable = ()) -> list[Rule]:
    """User rules (params `analysis.extra_rules`, tried first) + the built-in ones; a category not in
    CATEGORY_CLASS or a bad regex raises ParamsError."""
    out: list[Rule] = []
    for i, r in enumerate(extra_rules):
        if isinstance(r, dict):
            rule = Rule(r["category"], r.get("pattern") or "", r.get("cat"))
        else:
            rule = Rule(r.category, r.pattern, getattr(r, "cat", None))
        where = f"analysis.extra_rules[{i}]"
        if rule.category not in CATEGORY_CLASS and rule.category != WAIT_CATEGORY:
            raise ParamsError(f"unknown category {rule.category!r}", where=where,
                              hint=f"use one of {', '.join(CATEGORIES)}")
        try:
            re.compile(rule.pattern)
        except re.error as exc:
            raise ParamsError(f"pattern is not a valid regex: {exc}", where=where,
                              hint="it is a Python regex searched in the event name") from None
        out.append(rule)
    return out + builtin_rules()


def classify_name(name: str, cat: str | None, rules: list[Rule]) -> str:
    return _classify(name, cat, rules)[0]


def _classify(name: str, cat: str | None, rules: list[Rule]) -> tuple[str, str, bool]:
    """(category, source, generic) by name. Every named rule is tried before any catch-all, wherever it sits:
    `_C::cpu_fused_moe` must reach the MoE rule before the CPU catch-all's `^_C::` takes it."""
    for catch_all in (False, True):
        for r in rules:
            if r.catch_all != catch_all or (r.cat is not None and r.cat != cat):
                continue
            if r.regex.search(name):
                return r.category, ("catch_all" if catch_all else "name"), r.generic
    return "other", "none", False


_DECIDED: dict[tuple[Rule, ...], dict[tuple[str, str], tuple[str, str, bool]]] = {}
"""Per rule set, each (name, cat) pair's `_classify` result: ranks and load levels share most names, and the
regexes cost about 1 ms a name."""
_DECIDED_MAX_PAIRS = 200_000


def _decided(rules: list[Rule]) -> dict[tuple[str, str], tuple[str, str, bool]]:
    """The memo of `rules`' decisions, emptied once it holds `_DECIDED_MAX_PAIRS`."""
    key = tuple(rules)
    if key not in _DECIDED and len(_DECIDED) >= 8:  # a long-lived kernel trying many rule sets
        _DECIDED.clear()
    memo = _DECIDED.setdefault(key, {})
    if len(memo) > _DECIDED_MAX_PAIRS:
        memo.clear()
    return memo


def categorize(names: pd.Series, cats: pd.Series, rules: list[Rule]) -> np.ndarray:
    """Category per event by name alone; the rules run once per distinct (name, cat) pair."""
    return categorize_work(names, cats, rules)[0]


# Work whose name puts it in these classes/categories keeps its name's category whatever
# frame encloses it: a collective or a copy inside a norm module is still one.
_NAME_WINS = {"communication", "memory"}
_NAME_WINS_CATEGORIES = {"framework", "collective_wait"}
NAME_DECIDES = "name"
"""A context rule's category that stops outer frames' rules: the name decides inside it."""


def collective_of(name: str) -> str | None:
    """The collective an issuing op or annotation names (`nccl:all_reduce` is all_reduce), from the context
    rules' communication categories; None if none matches."""
    for r in context_rules():
        if CATEGORY_CLASS.get(r.category) == "communication" and r.regex.search(name):
            return r.category
    return None


def _context_applies(name_cat: str, decision: str, generic: bool = False) -> str | None:
    """The category a frame gives to work whose name says `name_cat`, or None (the name decides).

    The op decides what the name leaves open, and only that: a generic name takes an op of its class; compute
    work inside a compute op that refines it takes the op's (a softmax inside attention is attention). A
    collective op never makes compute work communication, nor a compute op communication, memory or framework
    work.
    """
    if not decision:
        return None
    ctx, _, only = decision.partition("|")
    if ctx == NAME_DECIDES:
        return None
    if generic:
        return ctx if CATEGORY_CLASS.get(ctx) == CATEGORY_CLASS.get(name_cat) else None
    if CATEGORY_CLASS.get(ctx) == "communication":
        return None
    if CATEGORY_CLASS.get(name_cat, "compute") in _NAME_WINS or name_cat in _NAME_WINS_CATEGORIES:
        return None
    if only and name_cat not in only.split(","):
        return None
    return ctx


def _factorize32(values) -> tuple[np.ndarray, Any]:
    """(int32 codes, distinct values) per event: a Categorical's own codes and categories when
    none is missing (no copy, no hash), else pd.factorize's."""
    if isinstance(values, pd.Categorical) and (len(values) == 0 or values.codes.min() >= 0):
        return values.codes, values.categories
    codes, uniques = pd.factorize(values)
    return codes.astype(np.int32), uniques


def categorize_work(names: pd.Series, cats: pd.Series, rules: list[Rule],
                    context: np.ndarray | pd.Categorical | None = None, *, as_codes: bool = False
                    ) -> tuple[np.ndarray, np.ndarray] | tuple[pd.Categorical, pd.Categorical]:
    """(category, source) per event; source is `context`, `name`, `catch_all` or `none`. `context`: the
    category the enclosing frames give ("" for none). The rules run once per distinct (name, cat) and frame
    decision, never per event; `as_codes` returns Categoricals."""
    n_codes, n_u = _factorize32(names)
    c_codes, c_u = _factorize32(cats)
    nc = max(len(c_u), 1)
    # Keyed by (name, cat) pair, found and looked up a slice at a time: a code per kernel
    # for the pairs was 4 bytes a kernel of stage 05's peak (issue 26).
    def pair(s: slice) -> np.ndarray:
        return n_codes[s].astype(np.int64) * nc + c_codes[s]

    p_u = first_keys(len(n_codes), pair)
    memo = _decided(rules)
    got = []
    for p in p_u:
        key = (str(n_u[p // nc]), str(c_u[p % nc]))
        if (found := memo.get(key)) is None:
            found = memo[key] = _classify(*key, rules)
        got.append(found)
    cat_table = [g[0] for g in got] + [g[1] for g in got] + ["context"]
    table = list(dict.fromkeys(cat_table))
    at = {v: i for i, v in enumerate(table)}
    # int16 codes (a rule set names far fewer categories), looked up a slice at a time
    category = lookup_keys(len(n_codes), pair, p_u, np.array([at[g[0]] for g in got], dtype=np.int16))
    source = lookup_keys(len(n_codes), pair, p_u, np.array([at[g[1]] for g in got], dtype=np.int16))
    # per distinct name: generic rules name no Kineto category, so a name's pairs agree
    generic_by_name = np.zeros(max(len(n_u), 1), dtype=np.int64)
    generic_by_name[[int(p // nc) for p, g in zip(p_u, got) if g[2]]] = 1
    if context is not None and len(context) and len(category):
        _context_decides(category, source, n_codes, generic_by_name, context, table, at)
    if as_codes:
        return (pd.Categorical.from_codes(category, categories=pd.Index(table, dtype=object)),
                pd.Categorical.from_codes(source, categories=pd.Index(table, dtype=object)))
    objs = np.array(table, dtype=object)
    return objs[category], objs[source]


def _context_decides(category: np.ndarray, source: np.ndarray, n_codes: np.ndarray, generic: np.ndarray,
                     context: np.ndarray | pd.Categorical, table: list, at: dict) -> None:
    """Apply the enclosing frames' decisions over the name's category in place (`source` becomes "context");
    `table`/`at` grow by any category only a frame gives."""
    x_codes, x_u = _factorize32(context if isinstance(context, pd.Categorical) else
                                np.asarray(context, dtype=object))
    x_u = np.asarray(x_u, dtype=object)
    nx = max(len(x_u), 1)
    def key(s: slice) -> np.ndarray:
        return (category[s].astype(np.int64) * nx + x_codes[s]) * 2 + generic[n_codes[s]]

    k_u = first_keys(len(category), key)
    decided = [_context_applies(table[int(k // 2 // nx)], x_u[(k // 2) % nx], bool(k % 2)) for k in k_u]
    for d in decided:
        if d is not None and d not in at:
            at[d] = len(table)
            table.append(d)
    new_cat = np.array([-1 if d is None else at[d] for d in decided], dtype=np.int16)
    order = np.argsort(k_u, kind="stable")
    sorted_k, sorted_new = k_u[order], new_cat[order]
    for lo in range(0, len(category), FACTORIZE_CHUNK_ROWS):
        s = slice(lo, lo + FACTORIZE_CHUNK_ROWS)
        nc_s = sorted_new[np.searchsorted(sorted_k, key(s))]  # each slice's keys before it changes
        use = nc_s >= 0
        category[s][use] = nc_s[use]
        source[s][use] = at["context"]


def resolve_waits(cats: np.ndarray, tids: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Replace `collective_wait` with the category of the preceding collective on its thread (events sorted by
    `order`), other_collective when there is none."""
    cats = cats.copy()
    last: dict = {}
    for i in order:
        c = cats[i]
        if c == WAIT_CATEGORY:
            cats[i] = last.get(tids[i], "other_collective")
        elif c in COLLECTIVE_CATEGORIES:
            last[tids[i]] = c
    return cats


def class_of(categories: pd.Series | np.ndarray) -> np.ndarray | pd.Categorical:
    """Each category's class (CATEGORY_CLASS; "compute" otherwise), Categorical in, Categorical out, judged
    once per distinct category."""
    s = pd.Series(categories)
    if not isinstance(s.dtype, pd.CategoricalDtype):
        return s.map(CATEGORY_CLASS).fillna("compute").to_numpy()
    return map_codes(s.array, lambda x: CATEGORY_CLASS.get(x, "compute"), missing="compute")
