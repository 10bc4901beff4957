"""A shard's asyncio runtime: what turns requests into commands for one replication shard,
waits for data, and runs the shard leader's timers.

Every part takes its collaborators in its constructor and none imports ``runtime`` (which
builds them all, the same way for every shard this node hosts). Inputs and outputs are plain
values (commands in; results, views and wake-ups out), so that the boundary between the gRPC
front end and a shard can become a process boundary without another redesign.
"""
