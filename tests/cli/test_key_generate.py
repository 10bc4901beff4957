"""``fluxmqctl key generate``: a key made offline that a node accepts as its bootstrap admin key
(here through ``FLUXMQ_AUTH_BOOTSTRAP_KEY``, the way compose passes it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fluxmq.core.auth import parse_key
from tests.integration.conftest import Node

from .conftest import Ctl


def test_generated_keys_are_well_formed_fresh_and_of_their_environment(tmp_path: Path) -> None:
    ctl = Ctl("127.0.0.1:1", tmp_path)  # no broker is involved
    live = [ctl.ok("key", "generate").strip() for _ in range(3)]
    assert len(set(live)) == 3
    for key in live:
        presented = parse_key(key)
        assert presented is not None and presented.kind == "live"
    staging = parse_key(ctl.ok("key", "generate", "--environment", "staging").strip())
    assert staging is not None and staging.kind == "test"


def test_a_generated_key_bootstraps_a_node_from_the_environment(tmp_path: Path) -> None:
    ctl = Ctl("127.0.0.1:1", tmp_path)
    key = ctl.ok("key", "generate").strip()
    node = Node(tmp_path / "node", "--auth", "on")
    node.env = {**os.environ, "FLUXMQ_AUTH_BOOTSTRAP_KEY": key}
    node.start()
    try:
        ctl = Ctl(node.address, tmp_path)
        assert ctl.fails(1, "key", "list").startswith("error: INVALID_API_KEY: ")
        doc = json.loads(
            ctl.run("-o", "json", "key", "list", env=ctl.env(FLUXMQ_API_KEY=key)).stdout
        )
        assert [(k["prefix"], k["role"], k["environment"]) for k in doc["keys"]] == [
            (key[:20], "admin", "production")
        ]
    finally:
        node.stop()
