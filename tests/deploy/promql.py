# A small PromQL scanner: the metric names and label matchers an expression refers to (enough for the deploy tests).
# Tested by tests/deploy/test_promql_scanner.py on hand-written expressions; used by the metric-name tests.
"""Not a full parser: it removes strings, ranges, grouping clauses and function calls, and what is left
as an identifier is a metric name. Grafana variables ($instance, $__rate_interval) are neutralised first."""
import re

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
            "offset", "bool", "inf", "nan", "atan2"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
_IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


def grafana_to_promql(expr: str, rate_interval: str = "1m", variables: dict | None = None) -> str:
    """Substitutes Grafana's $__rate_interval/$__interval/$__range and dashboard variables."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", rate_interval, expr)
    for name, value in (variables or {}).items():
        expr = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", value, expr)
    return expr


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)


def selectors(expr: str) -> list[tuple[str, list[str]]]:
    """(metric name, [label names in its {matchers}]) for every `name{...}` selector."""
    text = _strip_strings(expr)
    out = []
    for m in re.finditer(rf"({_IDENT})\s*\{{([^}}]*)\}}", text):
        if m.group(1) in KEYWORDS or m.group(1) in AGGREGATIONS:
            continue
        labels = re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2))
        out.append((m.group(1), labels))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads."""
    text = _strip_strings(grafana_to_promql(expr))
    text = re.sub(r"\{[^}]*\}", " ", text)                       # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                      # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    text = re.sub(r"(?<![a-zA-Z_:0-9])[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?", " ", text)  # numbers
    names = set()
    for m in re.finditer(rf"({_IDENT})(\s*\()?", text):
        ident, call = m.group(1), m.group(2)
        if call or ident.lower() in KEYWORDS or ident in AGGREGATIONS:
            continue
        names.add(ident)
    return names
