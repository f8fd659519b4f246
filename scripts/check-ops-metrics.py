#!/usr/bin/env python3
"""Checks that the Prometheus rules and the Grafana dashboard in ops/ name
only the metrics the gateway and the control stub export
(ops/prometheus/metrics.txt) and the recording rules defined beside them,
that the dashboard is well formed, and that every alert has its section in
the runbook. Writes every dashboard query, with Grafana's variables filled
in, as a recording rule into OUT, for `promtool check rules` to parse.

usage: check-ops-metrics.py METRICS RULES DASHBOARD RUNBOOK OUT
"""
import json
import re
import sys

METRIC = re.compile(r"(?<![A-Za-z0-9_:.$])(?:gateway|stub)_[a-z0-9_]+")
RECORDED = re.compile(r"\btalos:[a-z0-9_:]+")
# Grafana's variables, as Prometheus would see them once Grafana fills them in.
VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$instance": ".*",
}


def fail(errors):
    for e in errors:
        print(f"check-ops-metrics: {e}", file=sys.stderr)
    sys.exit(1)


def contract(path):
    names = set()
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        name, kind = line[0], line[1]
        names.add(name)
        if kind == "histogram":
            names.update(name + s for s in ("_bucket", "_sum", "_count"))
    return names


def names_in(expr, known, recorded, where, errors):
    """The metric names in `expr`; unknown ones are errors."""
    found = set()
    for name in RECORDED.findall(expr):
        found.add(name)
        if name not in recorded:
            errors.append(f"{where}: {name} is no recording rule of the rules file")
    for name in METRIC.findall(RECORDED.sub("", expr)):
        found.add(name)
        if name not in known:
            errors.append(f"{where}: {name} is not in the metrics contract")
    return found


def dashboard_exprs(node, out):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                out.append(value)
            else:
                dashboard_exprs(value, out)
    elif isinstance(node, list):
        for value in node:
            dashboard_exprs(value, out)


def main():
    metrics, rules_path, dash_path, runbook_path, out_path = sys.argv[1:6]
    known = contract(metrics)
    errors = []

    rules = open(rules_path, encoding="utf-8").read()
    recorded = set(re.findall(r"^\s*- record:\s*(\S+)", rules, re.M))
    body = "\n".join(l for l in rules.splitlines() if not l.lstrip().startswith("#"))
    used = names_in(body, known, recorded, rules_path, errors)

    runbook = open(runbook_path, encoding="utf-8").read().lower()
    for alert in re.findall(r"^\s*- alert:\s*(\S+)", rules, re.M):
        if not re.search(r"^#+\s+" + re.escape(alert.lower()) + r"\s*$", runbook, re.M):
            errors.append(f"{rules_path}: alert {alert} has no section in {runbook_path}")
    for anchor in re.findall(r"runbook: \"docs/runbook.md#([a-z0-9-]+)\"", rules):
        if not re.search(r"^#+\s+" + re.escape(anchor) + r"\s*$", runbook, re.M):
            errors.append(f"{rules_path}: runbook anchor #{anchor} names no section")

    try:
        dash = json.load(open(dash_path, encoding="utf-8"))
    except ValueError as e:
        fail([f"{dash_path}: not JSON: {e}"])
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in dash:
            errors.append(f"{dash_path}: no {key}")
    ids = []

    def walk_panels(panels):
        for p in panels:
            ids.append(p.get("id"))
            if "gridPos" not in p:
                errors.append(f"{dash_path}: panel {p.get('title')!r} has no gridPos")
            if p.get("type") != "row" and not p.get("targets"):
                errors.append(f"{dash_path}: panel {p.get('title')!r} has no query")
            walk_panels(p.get("panels", []))

    walk_panels(dash.get("panels", []))
    if len(ids) != len(set(ids)):
        errors.append(f"{dash_path}: panel ids are not unique")

    exprs = []
    dashboard_exprs(dash, exprs)
    for t in dash.get("templating", {}).get("list", []):
        q = t.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        m = re.match(r"label_values\((\w+)", q or "")
        if m:
            names_in(m.group(1), known, recorded, f"{dash_path}: variable {t['name']}", errors)
    rules_out = []
    for i, expr in enumerate(exprs):
        filled = expr
        for var, value in VARIABLES.items():
            filled = filled.replace(var, value)
        if "$" in filled:
            errors.append(f"{dash_path}: query {expr!r} uses a variable this check does not know")
        found = names_in(filled, known, recorded, f"{dash_path}: query {expr!r}", errors)
        if not found:
            errors.append(f"{dash_path}: query {expr!r} names no metric")
        used |= found
        rules_out.append(f"      - record: dashboard:query_{i}\n        expr: {json.dumps(filled)}\n")

    with open(out_path, "w", encoding="utf-8") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n" + "".join(rules_out))
    if errors:
        fail(errors)
    unused = sorted(n for n in known - used if not n.endswith(("_bucket", "_sum", "_count")))
    unused = [n for n in unused if n + "_bucket" not in used]
    print(f"{len(exprs)} dashboard queries and the rules name only contract metrics")
    if unused:
        print(f"  not shown anywhere: {', '.join(unused)}")


main()
