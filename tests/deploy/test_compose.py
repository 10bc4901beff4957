"""deploy/compose and deploy/Dockerfile: the compose file is valid and demands the cluster
secret and the first admin key (FLUXMQ_API_KEY), Prometheus scrapes exactly the nodes,
Grafana's provisioning agrees with the services, the image is built the way the compose file
and the nodes expect - and the compose topology (etcd + 3 nodes, with the commands and
environments of compose.yaml) forms a working cluster that refuses clients without a key when
run as processes on loopback (there is no Docker engine here)."""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import parse_key
from tests.deploy.compose_topology import (
    API_KEY_ENV,
    BOOTSTRAP_KEY_ENV,
    DOCKERFILE,
    DOCKERIGNORE,
    PROMETHEUS_FILE,
    REPO,
    SECRET_ENV,
    TEST_API_KEY,
    TEST_SECRET,
    Proc,
    as_list,
    clean_env,
    compose_config,
    etcd_service,
    exec_form,
    final_stage,
    host_env,
    http_get,
    interpolation_error,
    job_services,
    load_compose,
    make_pki,
    node_services,
    parse_dockerfile,
    running,
    volume_source,
    volume_target,
    wait_until,
)

READY_TIMEOUT_S = 45.0
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]
GRAFANA_DIR = REPO / "deploy" / "k8s" / "monitoring" / "grafana"


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    return load_compose()


def node_env(spec: Mapping[str, Any]) -> dict[str, str]:
    """What a node container's environment holds: the image's FLUXMQ_* ENV, then the service's."""
    image = {k: v for k, v in final_stage().env().items() if k.startswith("FLUXMQ_")}
    return {**image, **{k: str(v) for k, v in (spec.get("environment") or {}).items()}}


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def published(spec: Mapping[str, Any]) -> dict[int, int]:
    """container port -> host port of a service's published ports."""
    out = {}
    for entry in spec.get("ports", []):
        if isinstance(entry, Mapping):
            out[int(entry["target"])] = int(entry["published"])
        else:
            parts = str(entry).split("/")[0].split(":")
            out[int(parts[-1])] = int(parts[-2])
    return out


# -- a: the compose file --------------------------------------------------------------------


def test_compose_file_is_valid_with_the_secret_and_the_key_and_uses_them() -> None:
    done = compose_config(host_env(), "-q")
    assert done.returncode == 0, done.stderr
    text = (REPO / "deploy" / "compose" / "compose.yaml").read_text()
    assert not re.search(r"^version:", text, re.M), "the Compose spec has no version key"
    other_key = "fmq_live_sk_" + "A" * 32
    model = load_compose("another-secret-of-some-length", other_key)
    nodes = node_services(model)
    assert {n: s["environment"][SECRET_ENV] for n, s in nodes.items()} == {
        n: "another-secret-of-some-length" for n in nodes
    }
    # The host's FLUXMQ_API_KEY is every node's bootstrap admin key (and nothing else: the
    # node knows no setting api_key, and authentication is left at its default, on).
    for name, spec in nodes.items():
        env = node_env(spec)
        assert env[BOOTSTRAP_KEY_ENV] == other_key, name
        assert API_KEY_ENV not in env and "FLUXMQ_AUTH" not in env, name
        # The default environment, production, whose keys `fluxmqctl key generate` makes.
        assert "FLUXMQ_AUTH_BOOTSTRAP_ENVIRONMENT" not in env, name


@pytest.mark.parametrize(
    ("missing", "present"), [(SECRET_ENV, API_KEY_ENV), (API_KEY_ENV, SECRET_ENV)]
)
def test_compose_file_without_a_required_variable_fails_naming_it_and_the_readme(
    missing: str, present: str
) -> None:
    given = {SECRET_ENV: TEST_SECRET, API_KEY_ENV: TEST_API_KEY}
    del given[missing]
    done = compose_config(clean_env(**given), "-q")
    assert done.returncode != 0
    said = interpolation_error(done.stderr)
    assert f"set {missing} to " in said and "deploy/README.md" in said, done.stderr
    assert f"set {present} to " not in said, done.stderr


def test_nodes_are_one_definition_with_their_identities_and_the_data_on_volumes(
    model: dict[str, Any],
) -> None:
    nodes = node_services(model)
    assert list(nodes) == ["fluxmq-1", "fluxmq-2", "fluxmq-3"]
    raft = {n: node_env(s)["FLUXMQ_RAFT_LISTEN"] for n, s in nodes.items()}
    etcd_name, _ = etcd_service(model)
    for name, spec in nodes.items():
        env = node_env(spec)
        assert env["FLUXMQ_NODE_ID"] == name
        assert env["FLUXMQ_ADVERTISE"] == f"{name}:{port_of(env['FLUXMQ_LISTEN'])}"
        assert raft[name] == f"{name}:{port_of(env['FLUXMQ_RAFT_BIND'])}"
        assert set(env["FLUXMQ_PEERS"].split(",")) == {raft[n] for n in nodes if n != name}
        assert env["FLUXMQ_ETCD"].partition(":")[0] == etcd_name
        assert env["FLUXMQ_LOG_JSON"] == "true"
        assert as_list(spec.get("command")) == ["serve"]
        assert spec["build"]["dockerfile"] == "deploy/Dockerfile"
        assert Path(spec["build"]["context"]) == REPO
        assert spec["stop_grace_period"] == "30s"
        assert etcd_name in spec["depends_on"]
        assert env["FLUXMQ_DATA_DIR"] in {volume_target(v) for v in spec["volumes"]}, (
            f"{name}: the data directory is not on a volume"
        )
        test = spec["healthcheck"]["test"]
        assert test[0] == "CMD" and "/readyz" in " ".join(test)
    # Each node's client and metrics ports are published on their own host ports.
    assert {n: published(s) for n, s in nodes.items()} == {
        "fluxmq-1": {7070: 7070, 7071: 7071},
        "fluxmq-2": {7070: 7080, 7071: 7081},
        "fluxmq-3": {7070: 7090, 7071: 7091},
    }


# -- b: Prometheus and Grafana --------------------------------------------------------------


def test_prometheus_config_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not installed: `make sysdeps` installs it"
    done = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_FILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_scrapes_exactly_the_nodes_metrics_ports(model: dict[str, Any]) -> None:
    config = yaml.safe_load(PROMETHEUS_FILE.read_text())
    assert config["global"]["scrape_interval"] == "5s"
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }
    paths = {job.get("metrics_path", "/metrics") for job in config["scrape_configs"]}
    expected = {
        f"{name}:{port_of(node_env(spec)['FLUXMQ_METRICS_LISTEN'])}"
        for name, spec in node_services(model).items()
    }
    assert targets == expected
    assert paths == {"/metrics"}
    prometheus = model["services"]["prometheus"]
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    mounts = {volume_target(v): str(v).split(":")[0] for v in prometheus["volumes"]}
    assert Path(mounts[config_flag.partition("=")[2]]) == PROMETHEUS_FILE
    assert published(prometheus) == {9090: 9090}


def test_grafana_provisioning_points_at_the_compose_prometheus(model: dict[str, Any]) -> None:
    grafana = model["services"]["grafana"]
    mounts = {volume_target(v): Path(str(v).split(":")[0]) for v in grafana["volumes"]}
    for kind in ("datasources", "dashboards"):
        target = f"/etc/grafana/provisioning/{kind}"
        assert mounts[target] == GRAFANA_DIR / "provisioning" / kind, f"{target} is not mounted"
    datasources = [
        ds
        for f in sorted((GRAFANA_DIR / "provisioning" / "datasources").glob("*.y*ml"))
        for ds in yaml.safe_load(f.read_text())["datasources"]
    ]
    prom = [ds for ds in datasources if ds["type"] == "prometheus"]
    assert [ds["name"] for ds in prom] == ["Prometheus"]
    url = urlsplit(prom[0]["url"])
    assert url.hostname in model["services"] and url.hostname == "prometheus"
    assert url.port in published(model["services"]["prometheus"])
    providers = [
        p
        for f in sorted((GRAFANA_DIR / "provisioning" / "dashboards").glob("*.y*ml"))
        for p in yaml.safe_load(f.read_text())["providers"]
    ]
    for provider in providers:
        path = provider["options"]["path"]
        assert mounts.get(path) == GRAFANA_DIR / "dashboards", f"{path} is not mounted"
    assert (GRAFANA_DIR / "dashboards" / "fluxmq.json").is_file()
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert published(grafana) == {3000: 3000}


def test_images_are_pinned(model: dict[str, Any]) -> None:
    for name, spec in model["services"].items():
        if name in node_services(model) or name in job_services(model):
            continue  # the image built from deploy/Dockerfile
        image = spec["image"]
        tag = image.rpartition(":")[2]
        assert "/" not in tag and tag not in ("", "latest"), f"{name}: {image} is not pinned"
    assert re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.\d+", etcd_service(model)[1]["image"])


# -- c: the compose topology as processes ---------------------------------------------------


def bearer(api_key: str) -> tuple[tuple[str, str], ...]:
    """The call metadata of a client presenting ``api_key`` (what the SDK and fluxmqctl send)."""
    return (("authorization", f"Bearer {api_key}"),)


def cluster_status(address: str, api_key: str | None) -> admin_pb2.ClusterStatus:
    """AdminService.GetClusterStatus presenting ``api_key`` (None: no authorization at all)."""
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
        stub = admin_pb2_grpc.AdminServiceStub(ch)  # type: ignore[no-untyped-call]
        status: admin_pb2.ClusterStatus = stub.GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(),
            timeout=5,
            metadata=bearer(api_key) if api_key is not None else None,
        )
    return status


def refusal(call: Callable[[], object]) -> grpc.StatusCode | None:
    """The status code ``call`` fails with; None if it succeeds."""
    try:
        call()
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()
        return code
    return None


def grpc_health(address: str) -> int:
    """grpc.health.v1 Check of the whole server, with no key (health is exempt from auth)."""
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    return int(resp.status)


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def image_healthcheck() -> list[str]:
    """The Dockerfile's HEALTHCHECK as a compose-style exec test: ["CMD", ...]."""
    check = final_stage().last("HEALTHCHECK")
    assert check is not None, "the image has no HEALTHCHECK"
    argv = exec_form(check.partition("CMD")[2].strip())
    assert argv is not None, f"HEALTHCHECK is not in exec form: {check}"
    return ["CMD", *argv]


def healthcheck_argv(
    test: list[str], ip: str, localize: Callable[[str], str] = lambda a: a
) -> list[str]:
    """A container healthcheck (exec form) runnable here: on the service's address, with this
    machine's python / etcdctl (and ``localize`` mapping the container's mounted files)."""
    assert test[0] == "CMD", test
    argv = [localize(a).replace("127.0.0.1", ip) for a in test[1:]]
    if argv[0] == "python":
        argv[0] = sys.executable
    elif Path(argv[0]).name == "etcdctl":
        found = shutil.which("etcdctl")
        assert found is not None, "etcdctl is not installed: `make sysdeps` installs etcd-client"
        argv[0] = found
    return argv


def run_check(argv: list[str]) -> int:
    env = clean_env(ETCDCTL_API="3")
    return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode


def listen_port(argv: list[str], flag: str) -> tuple[str, int]:
    value = next(a.partition("=")[2] for a in argv if a.startswith(flag + "="))
    url = urlsplit(value.split(",")[0])
    assert url.hostname is not None and url.port is not None, value
    return url.hostname, url.port


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_compose_topology_run_as_processes_forms_a_cluster(tmp_path: Path) -> None:
    grace_s = 30.0
    pki = tmp_path / "pki"
    model = load_compose(pki=pki)
    with running(model, tmp_path) as topo:
        etcd, nodes = topo.etcd, topo.nodes
        make_pki(pki, etcd.ip)  # what the operator runs once (etcd's address here, too)
        (etcd_auth,) = topo.jobs
        assert [n.service for n in nodes] == ["fluxmq-1", "fluxmq-2", "fluxmq-3"]
        # The key the operator exported as FLUXMQ_API_KEY: every node's bootstrap admin key,
        # and what this test presents, as fluxmqctl on the host would.
        api_key = TEST_API_KEY
        assert {n.env[BOOTSTRAP_KEY_ENV] for n in nodes} == {api_key}
        auth = bearer(api_key)
        # Nothing may touch the container paths on this machine: the volumes became temp dirs.
        assert all(str(tmp_path) in n.env["FLUXMQ_DATA_DIR"] for n in nodes)
        assert any(a.startswith(f"--data-dir={tmp_path}") for a in etcd.argv), etcd.argv
        etcd_client = listen_port(etcd.argv, "--listen-client-urls")
        etcd_peer = listen_port(etcd.argv, "--listen-peer-urls")
        assert etcd_client[0] == etcd.ip
        node_ports = {
            n.service: [
                port_of(n.env[k])
                for k in ("FLUXMQ_LISTEN", "FLUXMQ_METRICS_LISTEN", "FLUXMQ_RAFT_BIND")
            ]
            for n in nodes
        }
        topo.check_ports({etcd.service: [etcd_client[1], etcd_peer[1]], **node_ports})

        topo.start(etcd)
        etcd_check = healthcheck_argv(
            model["services"][etcd.service]["healthcheck"]["test"],
            etcd.ip,
            functools.partial(topo.localize, etcd.service),
        )
        wait_until("etcd is healthy", lambda: run_check(etcd_check) == 0, 15, topo.diagnose)
        # compose: etcd-auth runs once etcd is healthy; the nodes wait for it to succeed.
        topo.start(etcd_auth)
        assert etcd_auth.popen is not None
        assert etcd_auth.popen.wait(60) == 0, topo.diagnose()
        assert_etcd_refuses_strangers(topo, pki, f"{etcd.ip}:{etcd_client[1]}")
        for node in nodes:
            topo.start(node)

        metrics = {n.service: topo.address(n, "FLUXMQ_METRICS_LISTEN") for n in nodes}
        grpc_at = {n.service: topo.address(n, "FLUXMQ_LISTEN") for n in nodes}
        start = time.monotonic()

        def ready(proc: Proc) -> bool:
            return http_get(metrics[proc.service], "/readyz")[0] == 200

        for node in nodes:
            wait_until(
                f"{node.service} /readyz answers 200",
                functools.partial(ready, node),
                max(1.0, READY_TIMEOUT_S - (time.monotonic() - start)),
                topo.diagnose,
            )
        assert all(http_get(metrics[n.service], "/healthz") == (200, "ok\n") for n in nodes)

        # The services' own healthchecks pass (run here against the service's address).
        for proc in (etcd, *nodes):
            spec = model["services"][proc.service]
            local = functools.partial(topo.localize, proc.service)
            assert run_check(healthcheck_argv(spec["healthcheck"]["test"], proc.ip, local)) == 0, (
                f"{proc.service}: its compose healthcheck fails\n{topo.diagnose()}"
            )
        for node in nodes:
            assert run_check(healthcheck_argv(image_healthcheck(), node.ip)) == 0

        # Authentication is on by default in the compose cluster: without a key, or with a key
        # the cluster never registered, every node refuses the call; health is exempt.
        unknown_key = "fmq_live_sk_" + "Z" * 32
        assert parse_key(unknown_key) is not None and unknown_key != api_key
        for node in nodes:
            for presented in (None, unknown_key):
                code = refusal(functools.partial(cluster_status, grpc_at[node.service], presented))
                assert code == grpc.StatusCode.UNAUTHENTICATED, (
                    f"{node.service}: GetClusterStatus with key {presented!r} gave {code}, not "
                    f"UNAUTHENTICATED: is authentication on?\n{topo.diagnose()}"
                )
            assert grpc_health(grpc_at[node.service]) == health_pb2.HealthCheckResponse.SERVING

        # Every node knows the same three nodes (by their compose identities) and one leader.
        ids = {n.env["FLUXMQ_NODE_ID"] for n in nodes}
        raft = {n.env["FLUXMQ_RAFT_LISTEN"] for n in nodes}
        advertised = {n.env["FLUXMQ_NODE_ID"]: n.env["FLUXMQ_ADVERTISE"] for n in nodes}
        statuses: dict[str, admin_pb2.ClusterStatus] = {}
        errors: dict[str, str] = {}

        def agreed() -> bool:
            for n in nodes:
                try:
                    statuses[n.service] = cluster_status(grpc_at[n.service], api_key)
                except grpc.RpcError as err:
                    errors[n.service] = f"{err.code().name}: {err.details()}"
                    return False
            leaders = set()
            for st in statuses.values():
                g1 = [s for s in st.shards if s.shard_id == "g1"]
                if {x.node_id for x in st.nodes} != ids or len(g1) != 1 or not g1[0].leader:
                    return False
                leaders.add(g1[0].leader)
            return len(leaders) == 1

        wait_until(
            "every node lists the 3 nodes and the same leader of g1",
            agreed,
            20,
            lambda: f"{statuses}\nlast errors: {errors}\n{topo.diagnose()}",
        )
        for service, st in statuses.items():
            assert st.node_id == service
            assert {x.node_id: x.grpc_address for x in st.nodes} == advertised, st
            assert {x.raft_address for x in st.nodes} == raft, st
            g1 = next(s for s in st.shards if s.shard_id == "g1")
            assert set(g1.members) == raft and g1.leader in raft, f"{service}: {g1}"

        # The three nodes all bootstrapped the same key: one admin key, whichever node is asked.
        bootstrap = parse_key(api_key)
        assert bootstrap is not None, "TEST_API_KEY is not a well-formed key"
        for node in nodes:
            with grpc.insecure_channel(grpc_at[node.service], options=CHANNEL_OPTIONS) as ch:
                admin = admin_pb2_grpc.AdminServiceStub(ch)  # type: ignore[no-untyped-call]
                keys = admin.ListApiKeys(
                    admin_pb2.ListApiKeysRequest(include_revoked=True), timeout=10, metadata=auth
                ).keys
            assert [(k.key_id, k.environment, k.role, k.revoked_ms) for k in keys] == [
                (bootstrap.key_id, "production", "admin", 0)
            ], f"{node.service}: {keys}"

        # Create through node 1, publish through node 2, read and consume through node 3.
        first, second, third = (
            grpc.insecure_channel(grpc_at[n.service], options=CHANNEL_OPTIONS) for n in nodes
        )
        with first, second, third:
            q1, q2, q3 = (
                queue_pb2_grpc.QueueServiceStub(ch)  # type: ignore[no-untyped-call]
                for ch in (first, second, third)
            )
            q1.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name="compose", partitions=1)),
                timeout=10,
                metadata=auth,
            )
            q1.CreateGroup(
                pb.CreateGroupRequest(queue="compose", group="g"), timeout=10, metadata=auth
            )
            sent = [b"m%d" % i for i in range(20)]
            resp, call = q2.Publish.with_call(
                pb.PublishRequest(
                    queue="compose", messages=[pb.PublishMessage(value=v) for v in sent]
                ),
                timeout=10,
                metadata=auth,
            )
            assert len(resp.results) == len(sent)
            leader_hint = dict(call.trailing_metadata() or ())["x-fluxmq-leader"]
            assert leader_hint in advertised.values()

            fetched: list[bytes] = []

            def fetch_all() -> bool:
                r = q3.Fetch(
                    pb.FetchRequest(queue="compose", partition=0, offset=0, wait_ms=200),
                    timeout=10,
                    metadata=auth,
                )
                fetched[:] = [rec.value for rec in r.records]
                return len(fetched) >= len(sent)

            wait_until("node 3 reads what node 2 published", fetch_all, 15, topo.diagnose)
            assert fetched == sent
            leased: list[bytes] = []
            deadline = time.monotonic() + 15
            while len(leased) < len(sent) and time.monotonic() < deadline:
                got = q3.Lease(
                    pb.LeaseRequest(
                        queue="compose", group="g", consumer_id="c", max_messages=50, wait_ms=200
                    ),
                    timeout=10,
                    metadata=auth,
                )
                leased += [m.record.value for m in got.messages]
                if got.messages:
                    q3.Ack(
                        pb.AckRequest(
                            queue="compose", group="g", receipts=[m.receipt for m in got.messages]
                        ),
                        timeout=10,
                        metadata=auth,
                    )
            assert sorted(leased) == sorted(sent)

        # Every node's /metrics answers; one leader of g1 among them; etcd sessions up.
        shard = (("shard", "g1"),)
        samples = {}
        for n in nodes:
            code, text = http_get(metrics[n.service], "/metrics")
            assert code == 200, text
            samples[n.service] = metric_samples(text)
        assert sum(s[("fluxmq_shard_is_leader", shard)] for s in samples.values()) == 1
        assert all(s[("fluxmq_etcd_session_up", ())] == 1 for s in samples.values())
        assert all(s[("fluxmq_node_ready", ())] == 1 for s in samples.values())

        # `docker compose stop`: SIGTERM to every node at once; each exits 0 within the grace.
        stopped = time.monotonic()
        for node in nodes:
            topo.signal(node, signal.SIGTERM)
        for node in nodes:
            assert node.popen is not None
            left = grace_s - (time.monotonic() - stopped)
            try:
                code = node.popen.wait(max(0.1, left))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{node.service} still runs {grace_s:.0f} s after SIGTERM\n{topo.diagnose()}"
                ) from None
            assert code == 0, f"{node.service} exited with {code}\n{topo.diagnose()}"
        print(f"\nnodes stopped {time.monotonic() - stopped:.1f} s after SIGTERM")


def etcdctl_put(endpoint: str, pki: Path, cert: str | None) -> str:
    """``etcdctl put /fluxmq/keys/...`` with the certificate ``<cert>.crt`` (None: none)."""
    argv = ["etcdctl", f"--endpoints=https://{endpoint}", f"--cacert={pki / 'ca.crt'}"]
    if cert is not None:
        argv += [f"--cert={pki / (cert + '.crt')}", f"--key={pki / (cert + '.key')}"]
    argv += ["--dial-timeout=3s", "--command-timeout=5s", "put", "/fluxmq/keys/aaaaaaaa", "{}"]
    done = subprocess.run(argv, env=clean_env(ETCDCTL_API="3"), capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    return done.stdout + done.stderr


def assert_etcd_refuses_strangers(topo: Any, pki: Path, endpoint: str) -> None:
    """After etcd-auth: no certificate, no connection; a certificate of the CA that names no
    user with rights there (etcd's own), no write; TLS alone is not the gate."""
    assert "OK" not in etcdctl_put(endpoint, pki, None), topo.diagnose()
    assert "permission denied" in etcdctl_put(endpoint, pki, "etcd"), topo.diagnose()


def test_etcd_runs_with_tls_client_certificates_and_auth_reachable_by_the_nodes_only(
    model: dict[str, Any],
) -> None:
    services = model["services"]
    etcd_name, etcd = etcd_service(model)
    command = as_list(etcd["command"])
    flags = dict(a.partition("=")[::2] for a in command[1:])
    assert flags["--listen-client-urls"].startswith("https://"), flags
    assert flags["--advertise-client-urls"].startswith("https://"), flags
    assert "--client-cert-auth" in command
    mounted = {volume_target(v): volume_source(v) for v in etcd["volumes"]}
    for flag in ("--cert-file", "--key-file", "--trusted-ca-file"):
        assert flags[flag] in mounted and mounted[flags[flag]].startswith("/"), flag
    # Reachable by the nodes only: an internal network, nothing published.
    assert model["networks"]["etcd"].get("internal") is True
    assert set(etcd["networks"]) == {"etcd"} and "ports" not in etcd
    on_etcd_net = {n for n, s in services.items() if "etcd" in (s.get("networks") or {})}
    jobs = job_services(model)
    assert on_etcd_net == {etcd_name, *node_services(model), *jobs}
    # etcd-auth turns authentication on before any node starts; only it holds root's key.
    assert list(jobs) == ["etcd-auth"]
    job = jobs["etcd-auth"]
    assert as_list(job["entrypoint"]) == ["python", "-m", "fluxmq.metadata.etcd_auth"]
    assert job["depends_on"][etcd_name]["condition"] == "service_healthy"
    job_args = dict(a.partition("=")[::2] for a in as_list(job["command"]))
    assert job_args["--endpoint"] == f"{etcd_name}:2379"
    assert job_args["--prefix"] == "/fluxmq/"
    root_keys = {volume_source(v) for v in job["volumes"] if volume_target(v).endswith(".key")}
    assert len(root_keys) == 1 and root_keys.pop().endswith("/root.key")
    for name, spec in node_services(model).items():
        env = node_env(spec)
        assert spec["depends_on"]["etcd-auth"]["condition"] == "service_completed_successfully"
        targets = {volume_target(v): volume_source(v) for v in spec["volumes"]}
        for setting, file in (("CA", "ca.crt"), ("CERT", "fluxmq.crt"), ("KEY", "fluxmq.key")):
            path = env[f"FLUXMQ_ETCD_{setting}_FILE"]
            assert targets[path].endswith("/" + file), (name, setting, targets)
        assert not any(s.endswith("/root.key") for s in targets.values()), name
        assert job_args["--user"] == "fluxmq"  # the common name of fluxmq.crt (etcd-pki.sh)


def test_healthcheck_commands_fail_when_nothing_answers(model: dict[str, Any]) -> None:
    """The checks above can fail: against an address where nothing listens they exit non-zero."""
    nobody = "127.0.9.250"
    node_check = model["services"]["fluxmq-1"]["healthcheck"]["test"]
    assert run_check(healthcheck_argv(node_check, nobody)) != 0
    assert run_check(healthcheck_argv(image_healthcheck(), nobody)) != 0


# -- d: the Dockerfile ----------------------------------------------------------------------


def test_dockerfile_builds_a_slim_non_root_image_of_the_package() -> None:
    stages = parse_dockerfile(DOCKERFILE.read_text())
    assert len(stages) >= 2, "a multi-stage build"
    build, final = stages[0], stages[-1]
    assert all(s.base.startswith("python:3.11-slim") for s in stages), [s.base for s in stages]
    # The package from the build context, without extras; only its virtualenv reaches the image.
    installs = [r for r in build.all("RUN") if re.search(r"pip install\b", r)]
    assert any(re.search(r"pip install (--?\S+ )*\.(\s|$)", r) for r in installs), installs
    assert not any("[" in r.partition("pip install")[2].split("&&")[0] for r in installs)
    copied_from = [c for c in final.all("COPY") if c.startswith("--from=")]
    assert copied_from == [f"--from={build.name} /opt/fluxmq /opt/fluxmq"]
    final_runs = " ".join(final.all("RUN"))
    for tool in ("build-essential", "gcc", "apt-get install", "pip install"):
        assert tool not in final_runs, f"the final stage installs {tool}"
    # Non-root, with the data directory a volume.
    user = final.last("USER")
    assert user is not None and user.split(":")[0] == "10001"
    env = final.env()
    assert env["FLUXMQ_DATA_DIR"] == "/var/lib/fluxmq"
    assert env["FLUXMQ_LISTEN"] == "0.0.0.0:7070"
    assert env["FLUXMQ_METRICS_LISTEN"] == "0.0.0.0:7071"
    assert env["FLUXMQ_LOG_JSON"] == "true"
    volumes = {v for args in final.all("VOLUME") for v in (exec_form(args) or args.split())}
    assert env["FLUXMQ_DATA_DIR"] in volumes
    assert any("-u 10001" in r or "--uid 10001" in r for r in final.all("RUN"))
    assert any(re.search(r"install -d -o 10001 .*/var/lib/fluxmq", r) for r in final.all("RUN"))
    # Ports: gRPC, HTTP (metrics/health) and Raft.
    exposed = {int(p.split("/")[0]) for args in final.all("EXPOSE") for p in args.split()}
    assert exposed == {7070, 7071, 7100}
    assert {port_of(env["FLUXMQ_LISTEN"]), port_of(env["FLUXMQ_METRICS_LISTEN"])} < exposed


def test_dockerfile_healthcheck_gets_healthz_with_python() -> None:
    final = final_stage()
    check = final.last("HEALTHCHECK")
    assert check is not None
    options, _, command = check.partition("CMD")
    argv = exec_form(command.strip())
    assert argv is not None and argv[:2] == ["python", "-c"], argv
    port = port_of(final.env()["FLUXMQ_METRICS_LISTEN"])
    assert f"'http://127.0.0.1:{port}/healthz'" in argv[2]
    compile(argv[2], "<healthcheck>", "exec")  # valid Python
    assert "--timeout=" in options and "--interval=" in options


def test_dockerfile_entrypoint_is_the_fluxmq_console_script() -> None:
    final = final_stage()
    assert exec_form(final.last("ENTRYPOINT") or "") == ["fluxmq"]
    assert exec_form(final.last("CMD") or "") == ["serve"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["fluxmq"] == "fluxmq.daemon:main"
    # The compose test runs the nodes as `python -m fluxmq`: the same function.
    main_py = (REPO / "fluxmq" / "__main__.py").read_text()
    assert "from fluxmq.daemon import main" in main_py
    assert final.last("STOPSIGNAL") == "SIGTERM"
    assert "/opt/fluxmq/bin" in final.env()["PATH"].split(":")


def test_dockerignore_keeps_local_state_out_and_what_the_build_copies_in() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for excluded in (".git", ".venv", "data", "cluster", "bench/results", ".pytest_cache"):
        assert excluded in patterns or any(excluded.startswith(p + "/") for p in patterns), (
            f"{excluded} is not in .dockerignore"
        )
    sources = [
        shlex.split(c)[:-1]
        for stage in parse_dockerfile(DOCKERFILE.read_text())
        for c in stage.all("COPY")
        if not c.startswith("--from=")
    ]
    copied = [s for src in sources for s in src]
    assert set(copied) >= {"pyproject.toml", "README.md", "fluxmq", "raft", "storage"}
    for path in copied:
        assert (REPO / path).exists(), path
        assert path not in patterns and not any(path.startswith(p + "/") for p in patterns)
    # Everything pyproject packages is copied.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= set(copied)
