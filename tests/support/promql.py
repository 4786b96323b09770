"""What ckptfs documents it exports, and which metric names a PromQL expression uses.

docs/metrics.md is the list of metrics (a live-scrape test keeps it exact); the dashboard and
alert tests check their expressions against it with `metric_names`, a small tokenizer written
here because no maintained Python PromQL parser exists (promtool checks syntax; this checks names).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# metrics Prometheus adds to every target itself
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "count", "count_over_time", "count_values", "day_of_month", "day_of_week", "delta", "deriv", "exp",
    "floor", "group", "histogram_quantile", "holt_winters", "hour", "idelta", "increase", "irate", "label_join",
    "label_replace", "last_over_time", "ln", "log10", "log2", "max", "max_over_time", "min", "min_over_time", "minute",
    "month", "predict_linear", "present_over_time", "quantile", "quantile_over_time", "rate", "resets", "round",
    "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev", "stddev_over_time", "stdvar", "stdvar_over_time", "sum",
    "sum_over_time", "time", "timestamp", "topk", "vector", "year",
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "inf", "nan"}


def documented_metrics() -> dict[str, tuple[str, str]]:
    """name -> (type, labels) from the tables of docs/metrics.md."""
    out = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = re.match(r"\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|([^|]*)\|", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3).strip())
    return out


def series_names(documented: dict[str, tuple[str, str]]) -> set[str]:
    """Every series name a scrape can carry: histogram families add _bucket, _sum and _count."""
    names = set(SYNTHETIC)
    for name, (kind, _) in documented.items():
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (label matchers, grouping clauses and functions removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors and subqueries
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    names = set()
    for token in re.findall(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w.])", expr):
        if token in FUNCTIONS or token in KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", token) or re.fullmatch(r"[eE]\d*", token):
            continue
        names.add(token)
    return names
