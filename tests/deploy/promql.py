"""Every PromQL expression the deployment ships, in a form Prometheus' grammar accepts, and the
metric names each one reads. Parsing is promql-parser's (a port of Prometheus' own parser).

Grafana's variables ($__rate_interval, "$model", ...) and the Prometheus Adapter's Go-template
placeholders (<<.Series>>, ...) are filled in with what Grafana and the adapter substitute at
query time before an expression is parsed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml

# Grafana's interval variables become durations; any other variable sits inside a label matcher.
_GRAFANA_INTERVAL = re.compile(
    r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|"
    r"interval|range)\}"
)
_GRAFANA_VARIABLE = re.compile(r"\$\{?\w+\}?")
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def metric_names(expression: str) -> set[str]:
    """The metric names an expression selects; ValueError if it does not parse."""
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expression), visit)
    return names


def exposed_names(exposition: str) -> set[str]:
    """Series names in a Prometheus text exposition, exactly as Prometheus stores them
    (prometheus_client's parser would rename counters to <name>_total, which Prometheus does
    not)."""
    return {
        re.split(r"[{\s]", line, maxsplit=1)[0]
        for line in exposition.splitlines()
        if line.strip() and not line.startswith("#")
    }


def grafana_query(expression: str) -> str:
    return _GRAFANA_VARIABLE.sub(".*", _GRAFANA_INTERVAL.sub("5m", expression))


def dashboard_expressions(path: Path) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of a dashboard."""
    dashboard = json.loads(path.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", grafana_query(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["query"]["query"])
            assert match, f"variable {variable['name']}: not label_values(selector, label)"
            yield f"variable {variable['name']}", grafana_query(match["selector"])


def adapter_expressions(path: Path) -> Iterator[tuple[str, str]]:
    """The Prometheus Adapter rules' seriesQuery, and metricsQuery as the adapter expands it for
    one pod's request."""
    rules = yaml.safe_load(path.read_text())["rules"]["custom"]
    for index, rule in enumerate(rules):
        series = rule["seriesQuery"]
        yield f"rule {index} seriesQuery", series
        name = metric_names(series).pop()
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", name)
            .replace("<<.LabelMatchers>>", 'namespace="inference",pod=~"demo-.*"')
            .replace("<<.GroupBy>>", "pod")
        )
        assert "<<" not in query, f"rule {index}: unknown placeholder in {query!r}"
        yield f"rule {index} metricsQuery", query


def alert_expressions(manifests: list[dict]) -> Iterator[tuple[str, str]]:
    for manifest in manifests:
        if manifest["kind"] == "PrometheusRule":
            for group in manifest["spec"]["groups"]:
                for rule in group["rules"]:
                    yield f"alert {rule.get('alert') or rule.get('record')}", rule["expr"]
