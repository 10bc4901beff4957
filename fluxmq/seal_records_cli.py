"""``fluxmq seal-records [the node's settings]``: an upgrade step. Nodes seal the records
placement acts on (nodes, groups, placements, leaders, node states, preferred leaders) with the
cluster secret and ignore records without a valid seal (``fluxmq.metadata.sealed_records``).
Records a version that did not seal them wrote would be ignored too; this seals them, once,
with the settings of a node (its config file, flags or FLUXMQ_* variables: etcd, its
credentials, the cluster secret). Stop the nodes, upgrade them, run it, start them.

The operator vouches for what etcd holds: a record sealed with another secret, or broken, is
reported and left alone, and the command exits 1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from fluxmq import config as config_mod
from fluxmq.cluster_metadata import etcd_metadata_store
from fluxmq.metadata.metadata import MetadataError
from fluxmq.metadata.sealed_records import ResealReport

USAGE = """usage: fluxmq seal-records [the settings of fluxmq serve: --config FILE, --etcd ...]

Seals, with the cluster secret, the records in etcd that a FluxMQ version without sealed
placement records wrote. Give it the settings a node of the cluster runs with (etcd, its
credentials and TLS files, the cluster secret); run it once after upgrading, nodes stopped."""


async def _reseal(cfg: config_mod.NodeConfig) -> ResealReport:
    store = etcd_metadata_store(cfg)
    try:
        return await store.reseal_records()
    finally:
        await store.close()


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if args and args[0] in ("--help", "-h"):
        print(USAGE)
        return 0
    try:
        cfg = config_mod.load(args)
    except config_mod.ConfigError as err:
        print(f"fluxmq seal-records: configuration error: {err}", file=sys.stderr)
        return 1
    if not cfg.etcd or not cfg.cluster_secret:
        print(
            "fluxmq seal-records: needs etcd and the cluster secret (a cluster node's settings)",
            file=sys.stderr,
        )
        return 1
    try:
        report = asyncio.run(_reseal(cfg))
    except MetadataError as err:
        print(f"fluxmq seal-records: {err}", file=sys.stderr)
        return 1
    print(f"sealed {report.sealed} record(s); {report.unchanged} needed nothing")
    for line in report.refused:
        print(f"refused: {line}", file=sys.stderr)
    return 1 if report.refused else 0
