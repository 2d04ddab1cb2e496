"""Kernel / op categories from the ordered rules in `rules.yaml` (first match wins)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Iterable

import numpy as np
import pandas as pd
import yaml

from stepscope.errors import ParamsError

CATEGORY_CLASS: dict[str, str] = {
    "all_reduce": "communication",
    "all_gather": "communication",
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
    "quantize": "compute",
    "sampling": "compute",
    "elementwise": "compute",
    "framework": "compute",
    "other": "compute",
    "memcpy": "memory",
    "memset": "memory",
}
"""Every category and its class. Exposed time is counted by class priority:
compute first, then communication, then memory. `framework` only occurs on CPU traces
(dispatcher and view/metadata ops); `other` is what no rule matched."""

CATEGORIES: tuple[str, ...] = tuple(CATEGORY_CLASS)
CLASS_PRIORITY: tuple[str, ...] = ("compute", "communication", "memory")
COLLECTIVE_CATEGORIES = ("all_reduce", "all_gather", "other_collective")
# A CPU wait on a collective is time spent in that collective: resolved per thread to
# the category of the collective op issued just before it.
WAIT_CATEGORY = "collective_wait"


@dataclass(frozen=True)
class Rule:
    category: str
    pattern: str
    cat: str | None = None

    @property
    def regex(self) -> re.Pattern:
        return _compile(self.pattern)


@lru_cache(maxsize=None)
def _compile(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def builtin_rules() -> list[Rule]:
    """The packaged rules, in order."""
    text = resources.files("stepscope.trace").joinpath("rules.yaml").read_text()
    return [Rule(r["category"], r.get("pattern") or "", r.get("cat"))
            for r in yaml.safe_load(text)["rules"]]


def make_rules(extra_rules: Iterable = ()) -> list[Rule]:
    """User rules (params `analysis.extra_rules`, tried first) + the built-in ones.

    Each extra rule may be a `RuleParams`, a dict or a Rule. A category not in
    CATEGORY_CLASS or a regex that does not compile raises ParamsError.
    """
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
    for r in rules:
        if r.cat is not None and r.cat != cat:
            continue
        if r.regex.search(name):
            return r.category
    return "other"


def categorize(names: pd.Series, cats: pd.Series, rules: list[Rule]) -> np.ndarray:
    """Category per event; the rules run once per distinct (name, cat) pair."""
    n_codes, n_u = pd.factorize(names)
    c_codes, c_u = pd.factorize(cats)
    if len(n_codes) == 0:
        return np.array([], dtype=object)
    pair = n_codes.astype(np.int64) * len(c_u) + c_codes
    p_codes, p_u = pd.factorize(pair)
    mapped = np.array([classify_name(str(n_u[p // len(c_u)]), str(c_u[p % len(c_u)]), rules)
                       for p in p_u], dtype=object)
    return mapped[p_codes]


def resolve_waits(cats: np.ndarray, tids: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Replace `collective_wait` with the category of the preceding collective on its thread.

    `order` sorts the events by time. A wait with no collective before it on its thread
    becomes other_collective.
    """
    cats = cats.copy()
    last: dict = {}
    for i in order:
        c = cats[i]
        if c == WAIT_CATEGORY:
            cats[i] = last.get(tids[i], "other_collective")
        elif c in COLLECTIVE_CATEGORIES:
            last[tids[i]] = c
    return cats


def class_of(categories: pd.Series | np.ndarray) -> np.ndarray:
    return pd.Series(categories).map(CATEGORY_CLASS).fillna("compute").to_numpy()
