#!/usr/bin/env python3
"""Checks that the Prometheus rules and the Grafana dashboard in ops/ name
only the metrics the gateway and the control stub export
(ops/prometheus/metrics.txt) and the recording rules defined beside them,
that the dashboard is well formed, and that every alert has its section in
the runbook and links to that section. Writes every dashboard query, with Grafana's variables filled
in, as a recording rule into OUT, for `promtool check rules` to parse.

With --gateway-scrape and --stub-scrape (the /metrics text of a running
gateway and `control-stub serve`, which was given the members --member
names), also checks the live scrapes: every metric of METRICS is there
with its type and labels (a histogram with _bucket, _sum and _count), no
gateway_* or stub_* metric is there that METRICS does not list, each
closed label has exactly the values METRICS lists (the stub's for each
member), and every series a rule or a dashboard query selects (name and
label matchers, but for the scrape target's `instance` and `job`) is there.

usage: check-ops-metrics.py METRICS RULES DASHBOARD RUNBOOK OUT
           [--gateway-scrape FILE --stub-scrape FILE --member ID...]
"""
import argparse
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


HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
# A selector: a metric name, then its label matchers if any.
SELECTOR = re.compile(
    r"(?<![A-Za-z0-9_:.$])((?:gateway|stub)_[a-z0-9_]+)\s*(?:\{([^}]*)\})?"
)
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
# Labels Prometheus adds from the scrape target: never in a scrape.
TARGET_LABELS = {"instance", "job"}


class Contract:
    """metrics.txt: each metric's type and labels; each closed label's
    values."""

    def __init__(self, path):
        self.kinds = {}
        self.labels = {}
        self.values = {}
        for n, raw in enumerate(open(path, encoding="utf-8"), 1):
            line = raw.split("#", 1)[0].split()
            if not line:
                continue
            m = re.fullmatch(r"([a-z0-9_]+)\{([a-z_]+)\}", line[0])
            if m:
                name, label = m.groups()
                if label not in self.labels.get(name, ()):
                    fail([f"{path}:{n}: {name} has no label {label}"])
                self.values.setdefault((name, label), set()).update(line[1:])
                continue
            if len(line) not in (2, 3):
                fail([f"{path}:{n}: expected NAME TYPE [LABEL,...]: {raw.strip()!r}"])
            name, kind = line[0], line[1]
            if kind not in ("counter", "gauge", "histogram"):
                fail([f"{path}:{n}: {name}: no such type {kind!r}"])
            self.kinds[name] = kind
            self.labels[name] = line[2].split(",") if len(line) == 3 else []

    def names(self):
        """Every name a query may use: a histogram's series too."""
        names = set(self.kinds)
        for name, kind in self.kinds.items():
            if kind == "histogram":
                names.update(name + s for s in HISTOGRAM_SERIES)
        return names


def contract(path):
    return Contract(path).names()


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


def parse_scrape(path):
    """The Prometheus text format: {name: type}, [(name, {label: value})]."""
    types, samples = {}, []
    for raw in open(path, encoding="utf-8"):
        line = raw.strip()
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+$", line)
            if not m:
                fail([f"{path}: not a sample: {line!r}"])
            samples.append((m.group(1), dict(LABEL.findall(m.group(2) or ""))))
    return types, samples


def matches(labels, matchers):
    for label, op, value in matchers:
        got = labels.get(label, "")
        if op == "=" and got != value:
            return False
        if op == "!=" and got == value:
            return False
        if op == "=~" and not re.fullmatch(value, got):
            return False
        if op == "!~" and re.fullmatch(value, got):
            return False
    return True


def check_live(c, scrapes, members, exprs, errors):
    """Checks the live scrapes (prefix -> file) against contract `c` and
    the selectors of `exprs` ((where, expression) pairs)."""
    samples = []
    for prefix, path in scrapes.items():
        types, got = parse_scrape(path)
        samples += got
        for name, kind in types.items():
            if name.startswith(("gateway_", "stub_")) and name not in c.kinds:
                errors.append(f"{path}: {name} ({kind}) is not in the metrics contract")
        for name, kind in c.kinds.items():
            if not name.startswith(prefix):
                continue
            if types.get(name) != kind:
                errors.append(
                    f"{path}: {name} is {types.get(name, 'absent')}, the contract says {kind}"
                )
                continue
            series = [name + s for s in HISTOGRAM_SERIES] if kind == "histogram" else [name]
            for s in series:
                found = [l for n, l in got if n == s]
                if not found:
                    errors.append(f"{path}: no {s} series")
                for labels in found:
                    names = set(labels) - ({"le"} if s.endswith("_bucket") else set())
                    if names != set(c.labels[name]):
                        errors.append(
                            f"{path}: {s} has labels {sorted(names)}, the contract says {c.labels[name]}"
                        )
            if kind == "histogram" and not any(
                n == name + "_bucket" and l.get("le") == "+Inf" for n, l in got
            ):
                errors.append(f"{path}: {name} has no le=\"+Inf\" bucket")
            if "gateway" in c.labels[name]:
                seen = {l.get("gateway") for n, l in got if n == name}
                for m in members:
                    if m not in seen:
                        errors.append(f"{path}: {name} has no series of member {m}")
        for (name, label), values in c.values.items():
            if not name.startswith(prefix):
                continue
            groups = {}
            for n, l in got:
                if n == name:
                    groups.setdefault(l.get("gateway"), set()).add(l.get(label))
            for member, seen in groups.items():
                of = f" of member {member}" if member else ""
                for v in sorted(values - seen):
                    errors.append(f"{path}: {name}{{{label}=\"{v}\"}}{of} is not exported")
                for v in sorted(seen - values):
                    errors.append(
                        f"{path}: {name}{{{label}=\"{v}\"}}{of} is exported but not in the contract"
                    )
    selectors = {(where, name, body) for where, expr in exprs for name, body in SELECTOR.findall(expr)}
    for where, name, body in sorted(selectors):
        wanted = [m for m in MATCHER.findall(body) if m[0] not in TARGET_LABELS]
        if not any(n == name and matches(l, wanted) for n, l in samples):
            shown = ",".join(f'{k}{op}"{v}"' for k, op, v in wanted)
            errors.append(f"{where}: selects {name}{{{shown}}}, which no live scrape holds")
    return len(selectors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for arg in ("metrics", "rules", "dashboard", "runbook", "out"):
        ap.add_argument(arg)
    ap.add_argument("--gateway-scrape")
    ap.add_argument("--stub-scrape")
    ap.add_argument("--member", action="append", default=[])
    args = ap.parse_args()
    if bool(args.gateway_scrape) != bool(args.stub_scrape):
        ap.error("--gateway-scrape and --stub-scrape go together")
    metrics, rules_path, dash_path = args.metrics, args.rules, args.dashboard
    runbook_path, out_path = args.runbook, args.out
    c = Contract(metrics)
    known = c.names()
    errors = []

    rules = open(rules_path, encoding="utf-8").read()
    recorded = set(re.findall(r"^\s*- record:\s*(\S+)", rules, re.M))
    body = "\n".join(l for l in rules.splitlines() if not l.lstrip().startswith("#"))
    used = names_in(body, known, recorded, rules_path, errors)
    selecting = [
        (f"{rules_path}: {kind} {name}", expr)
        for kind, name, expr in re.findall(
            r"^\s*- (alert|record):\s*(\S+)\n\s*expr:\s*(\|\n(?:\s{10,}.*\n?)+|.*)", body, re.M
        )
    ]

    runbook = open(runbook_path, encoding="utf-8").read().lower()
    for alert in re.findall(r"^\s*- alert:\s*(\S+)", rules, re.M):
        if not re.search(r"^#+\s+" + re.escape(alert.lower()) + r"\s*$", runbook, re.M):
            errors.append(f"{rules_path}: alert {alert} has no section in {runbook_path}")
    for anchor in re.findall(r"runbook: \"docs/runbook.md#([a-z0-9-]+)\"", rules):
        if not re.search(r"^#+\s+" + re.escape(anchor) + r"\s*$", runbook, re.M):
            errors.append(f"{rules_path}: runbook anchor #{anchor} names no section")
    # Each alert's link is to its own section: one alert's page must not
    # open another's (whose words may not fit it).
    for block in re.split(r"^\s*- (?=alert:|record:)", rules, flags=re.M)[1:]:
        alert = re.match(r"alert:\s*(\S+)", block)
        if not alert:
            continue
        links = re.findall(r"runbook: \"docs/runbook.md#([a-z0-9-]+)\"", block)
        if links != [alert.group(1).lower()]:
            errors.append(
                f"{rules_path}: alert {alert.group(1)} links the runbook at {links}, "
                f"not at its own section #{alert.group(1).lower()}"
            )

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
        selecting.append((f"{dash_path}: query {expr!r}", filled))
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
    if args.gateway_scrape:
        scrapes = {"gateway_": args.gateway_scrape, "stub_": args.stub_scrape}
        checked = check_live(c, scrapes, args.member, selecting, errors)
        if errors:
            fail(errors)
        print(
            f"live scrapes: {len(c.kinds)} contract metrics with their types, labels and "
            f"values; {checked} selectors of {len(selecting)} rules and queries present"
        )


main()
