"""The README's tour runs as written against a real node, and again: a second run must show the
same thing (no ALREADY_EXISTS, no empty read)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import grpc
from google.protobuf import json_format

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.config import NodeConfig, parse_tiers
from fluxmq.core.partitioner import key_partition

from .conftest import Node

README = Path(__file__).resolve().parents[2] / "README.md"
REPO = README.parent
RUN_TIMEOUT_S = 60


def block(marker: str, language: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", README.read_text(), re.S)
    assert match, f"README lost its {marker} block"
    return match.group(1)


def test_readme_python_tour_shows_what_it_promises_twice(node: Node) -> None:
    code = block("tour", "python")
    for run in (1, 2):
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "FLUXMQ_ADDR": node.address},
            capture_output=True,
            timeout=RUN_TIMEOUT_S,
        )
        out = proc.stdout.decode()
        assert proc.returncode == 0, (run, proc.stderr.decode())
        assert "stored at 1 0" in out, (run, out)  # user-7 hashes to partition 1 of 3
        assert "[(0, b'signed up'), (1, b'paid')]" in out, (run, out)
        assert "INVALID_ARGUMENT" in out, (run, out)
        assert "[(b'bad', 'corrupt')]" in out, (run, out)


def test_readme_shell_tour_reads_the_keyed_messages_twice(node: Node, tmp_path: Path) -> None:
    script = block("tour-sh", "sh")
    venv_bin = os.path.dirname(sys.executable)  # where this environment's fluxmqctl lives
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUXMQ")}
    env.update(
        FLUXMQ_ADDR=node.address, HOME=str(tmp_path), PATH=f"{venv_bin}:{env.get('PATH', '')}"
    )
    for run in (1, 2):
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert proc.returncode == 0, (run, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        tail = proc.stdout.split("published 3 messages to orders")[0]
        assert "signed up" in tail and "paid" in tail, (run, proc.stdout)
        assert tail.index("signed up") < tail.index("paid")
        assert "published 3 messages to orders" in proc.stdout, proc.stdout


def grpcurl_calls(script: str) -> list[tuple[str, str]]:
    """(method, JSON body) of each grpcurl command of a README block."""
    calls = []
    for command in script.replace("\\\n", " ").splitlines():
        words = shlex.split(command, comments=True)
        if not words:
            continue
        assert words[0] == "grpcurl", command
        body = words[words.index("-d") + 1]
        method = next(w for w in words if w.startswith("fluxmq.v1.QueueService/"))
        calls.append((method.rpartition("/")[2], body))
    return calls


def test_readme_grpcurl_tour_fetches_the_partition_it_published_to(node: Node) -> None:
    """grpcurl is not installed here: its bodies go through the same protobuf JSON mapping to
    the same methods, after the shell tour made the queue."""
    calls = grpcurl_calls(block("tour-grpcurl", "sh"))
    assert [m for m, _ in calls] == ["Publish", "Fetch", "GetQueueStats"]
    with grpc.insecure_channel(node.address) as channel:
        queues = queue_pb2_grpc.QueueServiceStub(channel)
        queues.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name="orders", partitions=3))
        )
        for _run in (1, 2):
            answers = {}
            for method, body in calls:
                request = json_format.Parse(body, getattr(pb, f"{method}Request")())
                answers[method] = getattr(queues, method)(request, timeout=10)
            published = answers["Publish"].results[0]
            fetch = json.loads(calls[1][1])
            assert published.partition == fetch["partition"] == key_partition(b"user-7", 3)
            assert [r.value for r in answers["Fetch"].records] == [b"shipped"]
            assert answers["GetQueueStats"].messages == 1


def test_readme_cli_examples_name_existing_tiers() -> None:
    tiers = set(parse_tiers(NodeConfig().rate_limit_tiers))
    examples = [line for line in README.read_text().splitlines() if "fluxmqctl" in line]
    named = re.findall(r"--tier[ =]([A-Za-z0-9_-]+)", "\n".join(examples))
    assert named, "README lost its key create example"
    assert set(named) <= tiers, (named, tiers)
