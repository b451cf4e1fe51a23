"""docs/operators.md's metrics table and Grafana dashboard name only metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sessions.ops import metrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
NAME = re.compile(r"\bqwenweb_[a-z_]+")


def exposed_names() -> set[str]:
    """Every sample name the metrics listener can expose (counters with ``_total``)."""
    names = set()
    for family in metrics.families().registry.collect():
        names.add(family.name)
        names.update(f"{family.name}{suffix}" for suffix in ("_total", "_bucket", "_sum", "_count"))
    return names


def test_every_metric_in_the_dashboard_exists():
    dashboard = json.loads((DOCS / "grafana" / "qwenweb-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert exprs
    used = {name for expr in exprs for name in NAME.findall(expr)}
    assert used <= exposed_names(), used - exposed_names()


def test_every_metric_is_described_in_operators_md():
    text = (DOCS / "operators.md").read_text()
    documented = set(NAME.findall(text))
    for family in metrics.families().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert name in documented, name
    assert documented <= exposed_names(), documented - exposed_names()
