"""The Grafana dashboard (deploy/k8s/monitoring/grafana/dashboards/fluxmq.json, also mounted by
deploy/compose): well-formed, on the provisioned datasource, PromQL that parses, and every metric
it queries exposed by a real node's /metrics, with only the labels the metrics have."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.integration.conftest import Node

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "k8s" / "monitoring" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "fluxmq.json"
DATASOURCE_UID = "prometheus"
# Labels of FluxMQ's metrics (the metrics contract) and those Prometheus adds to every series.
# Dashboards must not rely on others (e.g. Kubernetes' pod or namespace): compose has none.
METRIC_LABELS = {"queue", "group", "partition", "method", "code", "shard", "kind"}
TARGET_LABELS = {"instance", "job"}
GRAFANA_VARIABLES = {"instance", "queue", "shard"}

METRIC = re.compile(r"\b(?:fluxmq|process)_[A-Za-z0-9_]*\b")
SELECTOR = re.compile(r"\b((?:fluxmq|process)_[A-Za-z0-9_]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")

Panel = dict[str, Any]


def dashboard() -> dict[str, Any]:
    with open(DASHBOARD) as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def all_panels(panels: list[Panel]) -> Iterator[Panel]:
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    out = []
    for p in all_panels(dashboard()["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"]))
    return out


def variable_queries() -> list[tuple[str, str]]:
    out = []
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", q))
    return out


def test_dashboard_is_well_formed() -> None:
    doc = dashboard()
    assert doc["uid"] == "fluxmq" and doc["title"]
    assert 36 <= doc["schemaVersion"] <= 41
    panels = list(all_panels(doc["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == DATASOURCE_UID, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, p["title"]
            assert t["expr"].strip(), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in doc["templating"]["list"]}
    assert names == GRAFANA_VARIABLES
    for v in doc["templating"]["list"]:
        assert v["datasource"]["uid"] == DATASOURCE_UID, v["name"]


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_dashboard_covers_the_operations_topics() -> None:
    """The families an operator needs are on the dashboard (throughput, latency, lag, DLQ,
    Raft health, fsync, readiness, etcd, process resources)."""
    used = {m for _, q in queries() for m in METRIC.findall(q)}
    wanted = {
        "fluxmq_published_messages_total", "fluxmq_published_bytes_total",
        "fluxmq_leased_messages_total", "fluxmq_delivered_bytes_total",
        "fluxmq_rpc_duration_seconds_bucket", "fluxmq_rpc_duration_seconds_count",
        "fluxmq_group_lag_messages", "fluxmq_group_in_flight_messages",
        "fluxmq_group_scheduled_messages", "fluxmq_redelivered_messages_total",
        "fluxmq_dead_letter_messages", "fluxmq_dead_letter_alert",
        "fluxmq_shard_is_leader", "fluxmq_shard_term", "fluxmq_shard_commit_index",
        "fluxmq_shard_applied_index", "fluxmq_shard_apply_lag_entries",
        "fluxmq_shard_proposals_in_flight", "fluxmq_shard_in_sync_replicas",
        "fluxmq_raft_journal_fsync_seconds_bucket", "fluxmq_apply_commit_seconds_bucket",
        "fluxmq_raft_snapshot_bytes", "fluxmq_raft_snapshot_duration_seconds_count",
        "fluxmq_etcd_session_up", "fluxmq_node_ready",
        "process_cpu_seconds_total", "process_resident_memory_bytes",
    }  # fmt: skip
    assert not wanted - used, sorted(wanted - used)


def test_labels_are_those_of_the_metrics() -> None:
    allowed = METRIC_LABELS | TARGET_LABELS | {"le"}
    for where, q in queries() + variable_queries():
        labels = {m for _, body in SELECTOR.findall(q) for m in MATCHER.findall(body)}
        labels |= {lb.strip() for group in GROUPING.findall(q) for lb in group.split(",")}
        labels.discard("")
        assert labels <= allowed, f"{where}: labels {sorted(labels - allowed)} in {q}"
        for var in re.findall(r"\$(\w+)", q):
            assert var in GRAFANA_VARIABLES or var.startswith("__"), f"{where}: ${var}"


def for_promtool(expr: str) -> str:
    """Grafana's variables replaced by what they stand for, so Prometheus can parse it."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    for var in GRAFANA_VARIABLES:
        expr = expr.replace(f"${var}", ".*")
    assert "$" not in expr, expr
    return expr


def promtool_check_rules(exprs: list[tuple[str, str]], tmp_path: Path) -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by `make sysdeps` (Debian package prometheus)"
    rules = [
        {"record": f"dashboard:query_{n}", "expr": for_promtool(q)}
        for n, (_, q) in enumerate(exprs)
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


def test_promql_parses(tmp_path: Path) -> None:
    """Each query, as a recording rule, through `promtool check rules` (Prometheus' parser)."""
    assert promtool_check_rules(queries(), tmp_path) == ""
    assert promtool_check_rules([("bad", "sum by (queue (x)")], tmp_path) != ""


def test_provisioning_matches_the_dashboard_and_the_deployment() -> None:
    with open(GRAFANA / "provisioning" / "datasources" / "prometheus.yaml") as f:
        (ds,) = yaml.safe_load(f)["datasources"]
    assert (ds["name"], ds["uid"], ds["type"]) == ("Prometheus", DATASOURCE_UID, "prometheus")
    assert ds["url"] == "http://prometheus:9090"  # the Service in k8s, the service in compose
    with open(GRAFANA / "provisioning" / "dashboards" / "fluxmq.yaml") as f:
        (provider,) = yaml.safe_load(f)["providers"]
    assert provider["type"] == "file"
    dashboards_dir = provider["options"]["path"]
    # The k8s Grafana mounts the generated dashboard ConfigMap there.
    with open(REPO / "deploy" / "k8s" / "monitoring" / "grafana-deployment.yaml") as f:
        deployment = yaml.safe_load(f)
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = {
        volumes[m["name"]]["configMap"]["name"]: m["mountPath"]
        for m in c["volumeMounts"]
        if "configMap" in volumes[m["name"]]
    }
    assert mounted["grafana-dashboards"] == dashboards_dir
    assert mounted["grafana-datasources"] == "/etc/grafana/provisioning/datasources"
    assert mounted["grafana-dashboard-providers"] == "/etc/grafana/provisioning/dashboards"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{dashboards_dir}/{DASHBOARD.name}"
    with open(REPO / "deploy" / "k8s" / "kustomization.yaml") as f:
        generators = {g["name"]: g["files"] for g in yaml.safe_load(f)["configMapGenerator"]}
    assert generators["grafana-dashboards"] == [str(DASHBOARD.relative_to(REPO / "deploy/k8s"))]


# -- against a live node ---------------------------------------------------------------------


@pytest.fixture
def metrics_text(tmp_path: Path) -> Iterator[str]:
    """/metrics of a real single node after a little traffic (queue, publish, group, lease), so
    the labelled families have samples."""
    node = Node(tmp_path / "node")
    node.start()
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="dash")))
            stub.Publish(
                pb.PublishRequest(queue="dash", messages=[pb.PublishMessage(value=b"v")] * 3)
            )
            stub.Fetch(pb.FetchRequest(queue="dash"))
            stub.CreateGroup(pb.CreateGroupRequest(queue="dash", group="g"))
            stub.Lease(pb.LeaseRequest(queue="dash", group="g", consumer_id="c", max_messages=1))
        url = f"http://127.0.0.1:{node.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            yield r.read().decode()
    finally:
        node.stop()


SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


def exposed(text: str) -> dict[str, set[str] | None]:
    """Series names the node exposes -> label names seen on them (None: no sample yet)."""
    out: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            out.setdefault(family.name + suffix, None)
        for sample in family.samples:
            seen = out.get(sample.name) or set()
            out[sample.name] = seen | (set(sample.labels) - {"le", "quantile"})
    return out


def test_every_dashboard_metric_is_exposed_by_a_node(metrics_text: str) -> None:
    series = exposed(metrics_text)
    used: dict[str, list[str]] = {}
    for where, q in queries() + variable_queries():
        for name in METRIC.findall(q):
            used.setdefault(name, []).append(where)
    missing = {name: wheres[0] for name, wheres in sorted(used.items()) if name not in series}
    assert not missing, f"metrics on the dashboard that a node does not expose: {missing}"
    for where, q in queries():
        for name, body in SELECTOR.findall(q):
            labels = series[name]
            wanted = set(MATCHER.findall(body)) - TARGET_LABELS
            if labels is not None:  # with samples: the matchers' labels must be theirs
                assert wanted <= labels, f"{where}: {name} has no label {wanted - labels}"
