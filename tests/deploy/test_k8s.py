"""deploy/k8s: every manifest is a valid Kubernetes object, kustomization.yaml lists exactly the
files there are, and the FluxMQ StatefulSet is wired the way the node needs it: labels that the
Services and the PDB select, probes on the node's health endpoints, setting names the node knows,
and a per-pod entrypoint whose FLUXMQ_PEERS are the other replicas. The config test runs the
pod's real entrypoint and loads the result through fluxmq.config, as the container would: with
the cluster secret and the bootstrap admin key read from their mounted Secrets and client
authentication on."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from fluxmq.config import CONFIG_ENV, NodeConfig
from fluxmq.core.auth import new_key

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OPERATOR_DIR = "prometheus-operator"  # CRD objects, applied separately (not in kustomization)
# The oldest Kubernetes the manifests are meant for, and the newest the validator knows.
KUBE_VERSIONS = ("1.27.0", str(kubernetes_validate.latest_version()))
SETTINGS = {f.name for f in dataclasses.fields(NodeConfig)}
SETTING_ENV = {"FLUXMQ_" + name.upper() for name in SETTINGS} | {CONFIG_ENV}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
TEST_CLUSTER_SECRET = "s" * 64
TEST_ADMIN_KEY = new_key("production")  # as `fluxmqctl key generate > admin-key.txt` makes it

Obj = dict[str, Any]


# -- loading ---------------------------------------------------------------------------------


def load_docs(path: Path) -> list[Obj]:
    """The YAML documents of a file (a fresh copy: callers may change them)."""
    return copy.deepcopy(_parse(path))


@functools.cache
def _parse(path: Path) -> list[Obj]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomization() -> Obj:
    (doc,) = load_docs(K8S / "kustomization.yaml")
    return doc


def generator_files(kind: str) -> list[str]:
    """Files a config/secret generator reads (``key=path`` or ``path``), relative to K8S."""
    out = []
    for gen in kustomization().get(kind, []):
        for entry in gen.get("files", []) + gen.get("envs", []):
            out.append(entry.split("=", 1)[1] if "=" in entry else entry)
    return out


def all_yaml() -> list[str]:
    return sorted(str(p.relative_to(K8S)) for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml"))


def manifest_files() -> list[str]:
    """Every YAML file that holds Kubernetes objects: all but the kustomization and the
    generators' inputs (Prometheus and Grafana configuration)."""
    inputs = set(generator_files("configMapGenerator")) | set(generator_files("secretGenerator"))
    return [f for f in all_yaml() if f != "kustomization.yaml" and f not in inputs]


def objects() -> list[Obj]:
    return [doc for f in kustomization()["resources"] for doc in load_docs(K8S / f)]


def find(kind: str, name: str, objs: list[Obj] | None = None) -> Obj:
    hits = [
        o
        for o in (objects() if objs is None else objs)
        if o["kind"] == kind and o["metadata"]["name"] == name
    ]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def fluxmq_sts() -> Obj:
    return find("StatefulSet", "fluxmq")


def container(sts: Obj, name: str = "fluxmq") -> Obj:
    (c,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    found: Obj = c
    return found


def config_toml() -> dict[str, Any]:
    return tomllib.loads(find("ConfigMap", "fluxmq-config")["data"]["fluxmq.toml"])


def container_port(c: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c.get("ports", []) if p["name"] == port]
    return int(number)


def workloads(objs: list[Obj]) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] in ("StatefulSet", "Deployment", "DaemonSet"))


def pod_owners(objs: list[Obj]) -> Iterator[Obj]:
    """The workloads and the Jobs: every object with a pod template."""
    return (o for o in objs if o["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "Job"))


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- files and schema --------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("path", manifest_files())
def test_every_manifest_is_a_valid_kubernetes_object(path: str, version: str) -> None:
    docs = load_docs(K8S / path)
    assert docs, f"{path}: no YAML document"
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"{path}: not a Kubernetes object"
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            # Prometheus Operator CRDs: no schema in kubernetes-validate (SchemaNotFoundError),
            # so only what test_service_monitor_selects_the_headless_service checks.
            assert path.startswith(OPERATOR_DIR + "/"), f"{path}: CRD kinds live in {OPERATOR_DIR}/"
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{path}: {doc['kind']}/{doc['metadata']['name']} (k8s {version}): {err}")


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The schema check above can fail: a typo in a field name is an error, not ignored."""
    sts = copy.deepcopy(fluxmq_sts())
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSIONS[-1], strict=True)


def test_kustomization_lists_exactly_the_manifests() -> None:
    kust = kustomization()
    assert kust["namespace"] == "fluxmq"
    assert any(entry["pairs"] for entry in kust.get("labels", [])), "common labels"
    resources = kust["resources"]
    assert len(resources) == len(set(resources)), "a resource is listed twice"
    missing = [f for f in resources if not (K8S / f).is_file()]
    assert not missing, f"kustomization.yaml lists files that do not exist: {missing}"
    listed_or_operator = {f for f in manifest_files() if not f.startswith(OPERATOR_DIR + "/")}
    forgotten = sorted(listed_or_operator - set(resources))
    assert not forgotten, f"manifests not in kustomization.yaml resources: {forgotten}"
    for f in generator_files("configMapGenerator"):
        assert (K8S / f).is_file(), f"configMapGenerator input {f} does not exist"
    # The cluster secret is the operator's own file: it must never be committed.
    for f in generator_files("secretGenerator"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", str(K8S / f)], cwd=REPO, check=False
        ).returncode
        assert ignored == 0, f"secretGenerator input {f} is not git-ignored"


def test_kustomize_build_renders_valid_objects(tmp_path: Path) -> None:
    """The objects `kubectl apply -k` would send: generated ConfigMaps and Secret included, and
    every ConfigMap/Secret a pod mounts exists under its generated (hashed) name."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (kustomize build not checked)")
    version = subprocess.run(
        [kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
    )
    kustomize = json.loads(version.stdout or "{}").get("kustomizeVersion", "")
    if not re.match(r"v([5-9]|\d\d)\.", kustomize):
        pytest.skip(f"kubectl's kustomize is {kustomize or 'unknown'}; the manifests need v5+")
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    for f in generator_files("secretGenerator"):
        (tree / f).parent.mkdir(parents=True, exist_ok=True)  # etcd-pki/ is the operator's
        (tree / f).write_text("0123456789abcdef0123456789abcdef\n")
    proc = subprocess.run(
        [kubectl, "kustomize", str(tree)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    rendered = [d for d in yaml.safe_load_all(proc.stdout) if d]
    for doc in rendered:
        kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)
        meta = doc["metadata"]
        if doc["kind"] not in CLUSTER_SCOPED:
            assert meta.get("namespace") == "fluxmq", f"{doc['kind']}/{meta['name']}"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "fluxmq"
    binding = find("ClusterRoleBinding", "fluxmq-prometheus", rendered)
    assert [s["namespace"] for s in binding["subjects"]] == ["fluxmq"]
    names = {(d["kind"], d["metadata"]["name"]) for d in rendered}
    for w in pod_owners(rendered):
        for vol in w["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in names, vol
            if "secret" in vol:
                assert ("Secret", vol["secret"]["secretName"]) in names, vol
        sa = w["spec"]["template"]["spec"].get("serviceAccountName")
        assert sa is None or ("ServiceAccount", sa) in names


# -- the FluxMQ StatefulSet --------------------------------------------------------------------


def test_statefulset_has_volumes_probes_resources_and_spreading() -> None:
    sts = fluxmq_sts()
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    c = container(sts)
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == "fluxmq-headless"
    assert spec["replicas"] == 3
    # Data on a per-pod volume, mounted where the node keeps it.
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == config_toml()["data_dir"]
    # Probes on the node's HTTP endpoint (metrics_listen).
    metrics_port = int(config_toml()["metrics_listen"].rpartition(":")[2])
    for probe, path in [
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ]:
        get = c[probe]["httpGet"]
        assert (get["path"], container_port(c, get["port"])) == (path, metrics_port), probe
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= c["resources"][kind].keys(), kind
    spread = pod.get("topologySpreadConstraints") or pod["affinity"]["podAntiAffinity"]
    assert spread
    # SIGTERM handling needs its grace period (contract: 30 s or more), longer than the node's.
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= 30 and grace * 1000 > config_toml()["shutdown_grace_ms"]
    # Non-root, read-only root, volume writable through the group.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["fsGroup"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # Kubernetes would otherwise put FLUXMQ_SERVICE_HOST, FLUXMQ_PORT... into the environment.
    assert pod["enableServiceLinks"] is False
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == metrics_port
    assert annotations["prometheus.io/path"] == "/metrics"
    env = {e["name"]: e.get("value") for e in c["env"]}
    # The home group's pods are the first ones; more replicas join without one (scaling).
    assert int(env["HOME_GROUP_SIZE"]) == 3 <= spec["replicas"]
    # A pod beyond the home group drains before SIGTERM: the drain's wait and the node's
    # shutdown grace both fit in the grace period.
    drain_wait_s = int(re.search(r"--wait (\d+)", " ".join(pre_stop())).group(1))  # type: ignore[union-attr]
    assert drain_wait_s * 1000 + config_toml()["shutdown_grace_ms"] < grace * 1000


def test_ports_agree_with_the_node_config() -> None:
    c = container(fluxmq_sts())
    toml = config_toml()
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc"] == int(toml["listen"].rpartition(":")[2])
    assert ports["metrics"] == int(toml["metrics_listen"].rpartition(":")[2])
    assert ports["raft"] == int(toml["raft_bind"].rpartition(":")[2])
    assert env["FLUXMQ_RAFT_LISTEN"].endswith(f":{ports['raft']}")
    assert env["FLUXMQ_ADVERTISE"].endswith(f":{ports['grpc']}")
    headless = find("Service", "fluxmq-headless")["spec"]
    assert (
        f".{find('Service', 'fluxmq-headless')['metadata']['name']}." in env["FLUXMQ_RAFT_LISTEN"]
    )
    assert {p["port"] for p in headless["ports"]} == set(ports.values())


def test_services_and_pdb_select_their_pods() -> None:
    objs = objects()
    pods = [
        (w["metadata"]["name"], w["spec"]["template"]["metadata"]["labels"], w)
        for w in workloads(objs)
    ]
    for _name, labels, w in pods:
        assert selects(w["spec"]["selector"]["matchLabels"], labels), w["metadata"]["name"]
    for svc in (o for o in objs if o["kind"] == "Service"):
        matched = [(n, w) for n, labels, w in pods if selects(svc["spec"]["selector"], labels)]
        assert len(matched) == 1, f"Service {svc['metadata']['name']} selects {matched!r}"
        (_, w) = matched[0]
        containers = w["spec"]["template"]["spec"]["containers"]
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert any(_has_port(c, target) for c in containers), (
                f"Service {svc['metadata']['name']} port {port['name']}: no container port "
                f"{target!r}"
            )
    sts_labels = fluxmq_sts()["spec"]["template"]["metadata"]["labels"]
    pdb = find("PodDisruptionBudget", "fluxmq")
    assert selects(pdb["spec"]["selector"]["matchLabels"], sts_labels)
    assert pdb["spec"]["maxUnavailable"] == 1
    headless = find("Service", "fluxmq-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    assert selects(headless["selector"], sts_labels)
    assert selects(find("Service", "fluxmq")["spec"]["selector"], sts_labels)


def _has_port(c: Obj, target: int | str) -> bool:
    if isinstance(target, int):
        return any(p["containerPort"] == target for p in c.get("ports", []))
    return any(p["name"] == target for p in c.get("ports", []))


def test_service_monitor_selects_the_headless_service() -> None:
    (sm,) = load_docs(K8S / OPERATOR_DIR / "servicemonitor.yaml")
    assert sm["kind"] == "ServiceMonitor"
    chosen = [
        svc["metadata"]["name"]
        for svc in objects()
        if svc["kind"] == "Service"
        and selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    ]
    assert chosen == ["fluxmq-headless"]  # once: the client Service would scrape twice
    port_names = {p["name"] for p in find("Service", "fluxmq-headless")["spec"]["ports"]}
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= port_names


@pytest.mark.parametrize(
    "kind_name", [f"{w['kind']}/{w['metadata']['name']}" for w in pod_owners(objects())]
)
def test_pods_meet_the_restricted_pod_security_standard(kind_name: str) -> None:
    """namespace.yaml enforces "restricted": a pod that breaks it is never created."""
    assert (
        find("Namespace", "fluxmq")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        == "restricted"
    )
    kind, name = kind_name.split("/")
    pod = find(kind, name)["spec"]["template"]["spec"]
    psc = pod.get("securityContext", {})
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert not any("hostPath" in v for v in pod.get("volumes", []))
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, c["name"]
        assert sc.get("runAsUser", psc.get("runAsUser")) != 0, c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
        assert seccomp.get("type") == "RuntimeDefault", c["name"]


def test_images_are_pinned() -> None:
    kust_images = {i["name"]: i for i in kustomization()["images"]}
    for w in pod_owners(objects()):
        for c in w["spec"]["template"]["spec"]["containers"]:
            image = c["image"]
            name, _, tag = image.rpartition(":")
            if name in kust_images:  # our image: kustomization.yaml names it
                continue
            assert tag and tag != "latest" and "/" not in tag, f"{image} is not pinned"
    etcd = container(find("StatefulSet", "etcd"), "etcd")["image"]
    assert re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.\d+", etcd), etcd


# -- settings and the per-pod entrypoint ----------------------------------------------------------


def entrypoint() -> list[str]:
    c = container(fluxmq_sts())
    return list(c.get("command", [])) + list(c.get("args", []))


def pre_stop() -> list[str]:
    return list(container(fluxmq_sts())["lifecycle"]["preStop"]["exec"]["command"])


def test_env_and_toml_keys_are_node_settings() -> None:
    """A misspelt FLUXMQ_* variable or TOML key would be silently ignored by the node (the
    TOML loader rejects unknown keys, the environment is only read for known names)."""
    c = container(fluxmq_sts())
    names = {e["name"] for e in c["env"]} | set(
        re.findall(r"\bFLUXMQ_[A-Z0-9_]+", " ".join(entrypoint()))
    )
    flux = {n for n in names if n.startswith("FLUXMQ_")}
    assert flux, "no FLUXMQ_* variables found"
    unknown = sorted(flux - SETTING_ENV)
    assert not unknown, f"not settings of fluxmq.config.NodeConfig: {unknown}"
    unknown_keys = sorted(set(config_toml()) - SETTINGS)
    assert not unknown_keys, f"fluxmq.toml keys that are not settings: {unknown_keys}"


def kubelet_expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of env values and commands: $$ is a literal $, $(NAME) of a
    defined variable is its value, anything else stays as written."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def pod_environment(pod_name: str, namespace: str = "fluxmq") -> dict[str, str]:
    """The container's variables as the kubelet sets them, in order (fieldRefs filled in)."""
    env: dict[str, str] = {}
    for e in container(fluxmq_sts())["env"]:
        if "value" in e:
            env[e["name"]] = kubelet_expand(e["value"], env)
            continue
        ref = e["valueFrom"]["fieldRef"]["fieldPath"]
        env[e["name"]] = {"metadata.name": pod_name, "metadata.namespace": namespace}[ref]
    return env


def image_environment() -> dict[str, str]:
    """FLUXMQ_* variables the image's last stage sets (deploy/Dockerfile `ENV`)."""
    dockerfile = REPO / "deploy" / "Dockerfile"
    if not dockerfile.exists():
        return {}
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    final = text.split("\nFROM ")[-1]
    out: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            for word in shlex.split(line[4:]):
                key, _, value = word.partition("=")
                if key.startswith("FLUXMQ_"):
                    out[key] = value
    return out


def secret_contents(
    cluster_secret: str = TEST_CLUSTER_SECRET, admin_key: str = TEST_ADMIN_KEY
) -> dict[str, str]:
    """What the operator's files hold, by the generated Secrets' keys (kustomization.yaml)."""
    pem = "-----BEGIN CERTIFICATE-----\n"  # fluxmq.config only checks that they are readable
    return {
        "cluster_secret": cluster_secret,
        "auth_bootstrap_key": admin_key,
        **{name: pem for name in ("ca.crt", "fluxmq.crt", "fluxmq.key")},
    }


def run_entrypoint(
    tmp_path: Path,
    pod_name: str,
    fake_fluxmq: str,
    secrets: Mapping[str, str] | None = None,
    command: list[str] | None = None,
    tool: str = "fluxmq",
) -> subprocess.CompletedProcess[str]:
    """Runs the container command (or ``command``: the preStop hook) under /bin/sh with a
    stand-in ``tool`` first on PATH, the ConfigMap and Secrets written where the pod mounts
    them (paths mapped into tmp_path); ``secrets``: the content of each Secret key (default
    ``secret_contents()``)."""
    secrets = secret_contents() if secrets is None else secrets
    sts = fluxmq_sts()
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    kust_secret = {g["name"]: g for g in kustomization()["secretGenerator"]}
    remap: dict[str, str] = {}
    for mount in container(sts)["volumeMounts"]:
        vol = volumes.get(mount["name"])
        if vol is None or not ({"configMap", "secret"} & vol.keys()):
            continue
        where = tmp_path / "mounts" / mount["name"]
        where.mkdir(parents=True)
        remap[mount["mountPath"]] = str(where)
        if "configMap" in vol:
            data = find("ConfigMap", vol["configMap"]["name"])["data"]
        else:
            gen = kust_secret[vol["secret"]["secretName"]]
            keys = [entry.split("=", 1)[0] for entry in gen["files"]]
            unknown = sorted(set(keys) - secrets.keys())
            assert not unknown, f"no test content for the Secret keys {unknown}"
            data = {key: secrets[key] + "\n" for key in keys}  # as `... > file` writes them
        items = vol.get("configMap", vol.get("secret", {})).get("items")
        for item in items or [{"key": k, "path": k} for k in data]:
            (where / item["path"]).write_text(data[item["key"]])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / tool).write_text(fake_fluxmq)
    (bin_dir / tool).chmod(0o755)
    env = image_environment()
    for name, value in pod_environment(pod_name).items():
        for mount_path, local in remap.items():
            if value == mount_path or value.startswith(mount_path + "/"):
                value = local + value[len(mount_path) :]
        env[name] = value
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    env["PYTHON"] = sys.executable
    argv = [kubelet_expand(a, env) for a in (entrypoint() if command is None else command)]
    assert argv[0] == "/bin/sh", argv
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


PRINT_PEERS = '#!/bin/sh\nprintf "%s|%s|%s\\n" "$*" "$FLUXMQ_PEERS" "$FLUXMQ_JOIN"\n'


def raft_address(pod: str, namespace: str = "fluxmq") -> str:
    return f"{pod}.fluxmq-headless.{namespace}.svc.cluster.local:7100"


@pytest.mark.parametrize("ordinal", [0, 1, 2])
def test_entrypoint_peers_are_the_other_replicas(tmp_path: Path, ordinal: int) -> None:
    proc = run_entrypoint(tmp_path, f"fluxmq-{ordinal}", PRINT_PEERS)
    assert proc.returncode == 0, proc.stderr
    args, peers, join = proc.stdout.strip().split("|")
    assert args == "serve" and join == ""
    others = [raft_address(f"fluxmq-{i}") for i in range(3) if i != ordinal]
    assert peers.split(",") == others


@pytest.mark.parametrize("ordinal", [3, 4, 12])
def test_a_pod_beyond_the_home_group_joins_without_peers(tmp_path: Path, ordinal: int) -> None:
    """`kubectl scale --replicas 5`: the new pods join the cluster without a home group."""
    proc = run_entrypoint(tmp_path, f"fluxmq-{ordinal}", PRINT_PEERS)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "serve||true"


def test_entrypoint_refuses_a_pod_without_an_ordinal(tmp_path: Path) -> None:
    proc = run_entrypoint(tmp_path, "fluxmq", PRINT_PEERS)
    assert proc.returncode != 0 and "no ordinal" in proc.stderr, (proc.stdout, proc.stderr)


PRINT_CALL = '#!/bin/sh\nprintf "%s|%s\\n" "$*" "$FLUXMQ_API_KEY"\n'


@pytest.mark.parametrize("ordinal", [0, 2, 3, 4])
def test_pre_stop_drains_a_pod_beyond_the_home_group_until_it_restarts(
    tmp_path: Path, ordinal: int
) -> None:
    """Scaling down stops the highest pods: each first drains itself (state leaving, which it
    clears when it starts again) with the bootstrap admin key; a home group pod does not."""
    admin_key = new_key("production")
    proc = run_entrypoint(
        tmp_path,
        f"fluxmq-{ordinal}",
        PRINT_CALL,
        secret_contents("0123456789abcdef" * 4, admin_key),
        command=pre_stop(),
        tool="fluxmqctl",
    )
    assert proc.returncode == 0, proc.stderr
    if ordinal < 3:
        assert proc.stdout == ""
        return
    args, key = proc.stdout.strip().split("|")
    assert key == admin_key
    assert args.split() == [
        "--server", "127.0.0.1:7070", "node", "drain", f"fluxmq-{ordinal}", "--until-restart",
        "--wait", "540",
    ]  # fmt: skip
    # The flags are fluxmqctl's own: the command parses.
    from fluxmq.cli.main import build_parser

    parsed = build_parser().parse_args(args.split())
    assert parsed.until_restart and parsed.wait_s == 540 and parsed.node_id == f"fluxmq-{ordinal}"


LOAD_CONFIG = """#!/bin/sh
exec "$PYTHON" -c '
import dataclasses, json, sys
from fluxmq.config import load
config = load(sys.argv[2:])
print(json.dumps({**dataclasses.asdict(config), "auth_enabled": config.auth_enabled}))
' "$@"
"""


@pytest.mark.parametrize("ordinal", [0, 2, 3])
def test_pod_configuration_loads_through_the_node_config(tmp_path: Path, ordinal: int) -> None:
    """What `fluxmq serve` sees in the pod: the image's ENV, the pod's env, the ConfigMap TOML
    (FLUXMQ_CONFIG), the mounted secret files, the computed FLUXMQ_PEERS, all validated by
    fluxmq.config.load as at start."""
    secret = "0123456789abcdef" * 4
    admin_key = new_key("production")
    proc = run_entrypoint(
        tmp_path, f"fluxmq-{ordinal}", LOAD_CONFIG, secret_contents(secret, admin_key)
    )
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)
    toml = config_toml()
    # The image's FLUXMQ_* ENV beats the TOML file: the ConfigMap must not be silently shadowed.
    shadowed = {k: (toml[k], cfg[k]) for k in toml if cfg[k] != toml[k]}
    assert not shadowed, f"ConfigMap settings overridden by the environment: {shadowed}"
    me = f"fluxmq-{ordinal}"
    assert cfg["node_id"] == me
    assert cfg["raft_listen"] == raft_address(me)
    assert cfg["advertise"] == f"{me}.fluxmq-headless.fluxmq.svc.cluster.local:7070"
    if ordinal >= 3:  # beyond the home group: joins without peers
        assert cfg["join"] is True and cfg["peers"] == ""
    else:
        assert cfg["join"] is False
        assert sorted(cfg["peers"].split(",")) == [
            raft_address(f"fluxmq-{i}") for i in range(3) if i != ordinal
        ]
    assert cfg["cluster_secret"] == secret
    # Clients authenticate (the default in a cluster, not switched off anywhere), and the
    # first admin key is the operator's admin-key.txt, a key of the bootstrap environment.
    assert cfg["auth_enabled"] is True and cfg["auth"] in ("auto", "on"), cfg["auth"]
    assert cfg["auth_bootstrap_key"] == admin_key
    assert cfg["auth_bootstrap_environment"] == "production"
    assert cfg["etcd"] == "etcd:2379"
    # etcd over TLS with the brokers' client certificate, from their mounted Secret.
    for setting, file in (("ca", "ca.crt"), ("cert", "fluxmq.crt"), ("key", "fluxmq.key")):
        assert cfg[f"etcd_{setting}_file"].endswith("/" + file), (setting, cfg)
    etcd_service = find("Service", cfg["etcd"].rpartition(":")[0])
    assert int(cfg["etcd"].rpartition(":")[2]) in {p["port"] for p in etcd_service["spec"]["ports"]}


@pytest.mark.parametrize(
    "content",
    [
        "0123456789abcdef" * 4,  # `openssl rand -hex 32 > admin-key.txt`: not a key
        new_key("staging"),  # fmq_test_sk_: not a key of production, the bootstrap environment
    ],
)
def test_pod_refuses_an_admin_key_file_that_is_not_a_production_key(
    tmp_path: Path, content: str
) -> None:
    """The replica stops at start (configuration error) instead of running without an admin."""
    proc = run_entrypoint(tmp_path, "fluxmq-0", LOAD_CONFIG, secret_contents(admin_key=content))
    assert proc.returncode != 0, proc.stdout
    assert "auth_bootstrap_key_file" in proc.stderr, proc.stderr
    assert content not in proc.stderr, "the error must not show the file's content"


# -- etcd: TLS, client certificates, authentication, reachable by the brokers only ---------------


def pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def secret_mounts(workload: Obj, name: str) -> dict[str, str]:
    """mountPath -> secretName of a container's Secret volumes."""
    pod = workload["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    return {
        m["mountPath"]: secrets[m["name"]]
        for m in container(workload, name)["volumeMounts"]
        if m["name"] in secrets
    }


def secret_files(secret_name: str) -> dict[str, str]:
    (gen,) = [g for g in kustomization()["secretGenerator"] if g["name"] == secret_name]
    return dict(entry.split("=", 1) for entry in gen["files"])


def test_etcd_serves_tls_only_to_client_certificates_of_its_ca() -> None:
    etcd = find("StatefulSet", "etcd")
    env = {e["name"]: e["value"] for e in container(etcd, "etcd")["env"] if "value" in e}
    assert env["ETCD_LISTEN_CLIENT_URLS"].startswith("https://"), env
    assert env["ETCD_ADVERTISE_CLIENT_URLS"].startswith("https://"), env
    assert env["ETCD_CLIENT_CERT_AUTH"] == "true"
    mounts = secret_mounts(etcd, "etcd")
    for var, file in (("CERT", "etcd.crt"), ("KEY", "etcd.key"), ("TRUSTED_CA", "ca.crt")):
        path = env[f"ETCD_{var}_FILE"]
        directory, _, name = path.rpartition("/")
        assert name == file and directory in mounts, (var, path, mounts)
        assert secret_files(mounts[directory])[name] == f"etcd-pki/{file}"


def test_etcd_auth_job_enables_authentication_with_roots_certificate_for_the_brokers_user() -> None:
    job = find("Job", "etcd-auth")
    argv = container(job, "etcd-auth")["command"]
    assert argv[:3] == ["python", "-m", "fluxmq.metadata.etcd_auth"]
    args = dict(a.partition("=")[::2] for a in argv[3:])
    assert args["--endpoint"].rpartition(":")[0] == "etcd"
    assert args["--prefix"] == config_toml()["etcd_prefix"]
    assert args["--user"] == "fluxmq"  # the common name of fluxmq.crt (deploy/etcd-pki.sh)
    mounts = secret_mounts(job, "etcd-auth")
    for flag, file in (("--ca-file", "ca.crt"), ("--cert-file", "root.crt"),
                       ("--key-file", "root.key")):  # fmt: skip
        directory, _, name = args[flag].rpartition("/")
        assert name == file and secret_files(mounts[directory])[name] == f"etcd-pki/{file}"
    # Root's key is the job's alone; the brokers hold their own certificate.
    broker = secret_mounts(fluxmq_sts(), "fluxmq")
    assert not any("root.key" in secret_files(s) for s in broker.values() if s != "fluxmq-admin-key"
                   and s != "fluxmq-cluster-secret")  # fmt: skip
    assert "fluxmq.key" in secret_files(broker["/var/run/secrets/fluxmq-etcd"])


def policy_for(workload: Obj) -> Obj:
    hits = [
        p
        for p in objects()
        if p["kind"] == "NetworkPolicy"
        and selects(p["spec"]["podSelector"]["matchLabels"], pod_labels(workload))
    ]
    assert len(hits) == 1, f"{workload['metadata']['name']}: {len(hits)} NetworkPolicies"
    return hits[0]


def allowed_peers(policy: Obj, port: int) -> list[dict[str, str]] | None:
    """The pod labels allowed to reach ``port`` (None: anyone), by the policy's ingress rules."""
    peers: list[dict[str, str]] = []
    for rule in policy["spec"].get("ingress", []):
        ports = rule.get("ports")
        if ports and not any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports):
            continue
        if "from" not in rule:
            return None
        peers += [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    return peers


def test_network_policies_let_only_brokers_reach_etcd_and_the_raft_ports() -> None:
    etcd, broker, job = find("StatefulSet", "etcd"), fluxmq_sts(), find("Job", "etcd-auth")
    etcd_policy = policy_for(etcd)
    assert etcd_policy["spec"]["policyTypes"] == ["Ingress"]
    client = container_port(container(etcd, "etcd"), "client")
    peers = allowed_peers(etcd_policy, client)
    assert peers is not None and peers, "etcd's client port is open to every pod"
    assert all(selects(p, pod_labels(broker)) or selects(p, pod_labels(job)) for p in peers)
    assert any(selects(p, pod_labels(broker)) for p in peers)
    for other in pod_owners(objects()):
        if other["metadata"]["name"] not in ("fluxmq", "etcd-auth"):
            assert not any(selects(p, pod_labels(other)) for p in peers), other["metadata"]
    broker_policy = policy_for(broker)
    raft = container_port(container(broker), "raft")
    # The home group's Raft port and those of the extra groups a node may host (16).
    for port in (raft, raft + 1, raft + 16):
        raft_peers = allowed_peers(broker_policy, port)
        assert raft_peers, f"Raft port {port} is open to every pod"
        assert all(selects(p, pod_labels(broker)) for p in raft_peers), port
    for name in ("grpc", "metrics"):  # clients (with a key), probes and Prometheus
        assert allowed_peers(broker_policy, container_port(container(broker), name)) is None


# -- Prometheus ----------------------------------------------------------------------------------


def prometheus_config() -> dict[str, Any]:
    (path,) = [f for f in generator_files("configMapGenerator") if f.endswith("prometheus.yml")]
    with open(K8S / path) as f:
        doc: dict[str, Any] = yaml.safe_load(f)
    return doc


def promtool_check(config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by `make sysdeps` (Debian package prometheus)"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    config = prometheus_config()
    proc = promtool_check(config, tmp_path)
    if "field kubernetes_sd_configs not found" in proc.stdout + proc.stderr:
        # Debian's promtool is built without Kubernetes discovery. Check the rest (relabel
        # rules, regexes, globals) with the discovery swapped for an empty static list.
        for job in config["scrape_configs"]:
            sd = job.pop("kubernetes_sd_configs", None)
            if sd is not None:
                assert all(s["role"] == "pod" for s in sd)
                job["static_configs"] = [{"targets": []}]
        proc = promtool_check(config, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_check_can_fail(tmp_path: Path) -> None:
    config = prometheus_config()
    for job in config["scrape_configs"]:
        job.pop("kubernetes_sd_configs", None)
        job["static_configs"] = [{"targets": []}]
    config["scrape_configs"][-1]["relabel_configs"][0]["regex"] = "(unclosed"
    assert promtool_check(config, tmp_path).returncode != 0


def sanitize(annotation: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", annotation)


def test_prometheus_scrapes_the_annotated_fluxmq_pods() -> None:
    """The relabel rules read the annotations the FluxMQ pods carry, under Prometheus' names."""
    (job,) = [j for j in prometheus_config()["scrape_configs"] if "kubernetes_sd_configs" in j]
    pod_annotations = fluxmq_sts()["spec"]["template"]["metadata"]["annotations"]
    meta = {
        "__meta_kubernetes_pod_annotation_" + sanitize(k): v for k, v in pod_annotations.items()
    }
    used = {
        label
        for rule in job["relabel_configs"]
        for label in rule.get("source_labels", [])
        if label.startswith("__meta_kubernetes_pod_annotation_")
    }
    assert used and used <= meta.keys(), f"annotations not on the FluxMQ pods: {used - meta.keys()}"
    (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    (source,) = keep["source_labels"]
    assert re.fullmatch(keep["regex"], meta[source])
    # Grafana's datasource URL (http://prometheus:9090) is this Service.
    svc = find("Service", "prometheus")
    assert 9090 in {p["port"] for p in svc["spec"]["ports"]}
