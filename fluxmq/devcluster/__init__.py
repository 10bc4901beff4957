"""The dev cluster launcher: a tool to run a local multi-node FluxMQ cluster for development
(one etcd and N ``fluxmq serve`` processes on loopback), used by ``fluxmq cluster
up|down|status``, the tests and the benchmarks. It is not part of the broker: no node imports it.

``launcher`` does the work (``LocalCluster``); ``cli`` is the ``fluxmq cluster`` command.
"""
