"""The node's etcd metadata store, as its settings describe it (the node and `fluxmq
seal-records` open it the same way)."""

from __future__ import annotations

from fluxmq import config as config_mod
from fluxmq.metadata import EtcdMetadataStore


def etcd_metadata_store(cfg: config_mod.NodeConfig) -> EtcdMetadataStore:
    return EtcdMetadataStore(
        cfg.etcd,
        prefix=cfg.etcd_prefix,
        username=cfg.etcd_user or None,
        password=cfg.etcd_password or None,
        ca_file=cfg.etcd_ca_file,
        cert_file=cfg.etcd_cert_file,
        key_file=cfg.etcd_key_file,
        # API key records and the records placement acts on sealed with the cluster secret:
        # writing to etcd mints no key and moves no replica.
        record_secret=cfg.cluster_secret,
    )
