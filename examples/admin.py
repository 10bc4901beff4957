"""Looks around a broker with the blocking client: queues, stats, groups, dead letters, cluster.

.venv/bin/python examples/admin.py
"""

from __future__ import annotations

from fluxmq.client import Client, QueueNotFound


def main() -> None:
    with Client() as client:  # $FLUXMQ_ADDR or 127.0.0.1:7070
        status = client.admin.cluster_status()
        for shard in status.shards:
            print(
                f"node {status.node_id}: shard {shard.shard_id} {shard.role}, "
                f"applied {shard.applied_index}, queues {list(shard.queues)}"
            )

        for queue in client.admin.list_queues():
            stats = client.admin.queue_stats(queue.config.name)
            print(
                f"{queue.config.name}: {stats.messages} messages in "
                f"{len(stats.partitions)} partitions, {stats.dead_letters} dead letters"
            )
            for lag in stats.groups:
                print(f"  group {lag.name}: lag {lag.lag}, in flight {lag.in_flight}")

        try:
            groups = client.admin.list_groups("orders")
        except QueueNotFound as err:
            print(f"no orders queue yet ({err.reason}, request id {err.request_id})")
            return
        for group in groups:
            desc = client.admin.describe_group("orders", group.name)
            print(
                f"orders/{group.name}: {len(desc.members)} members, "
                f"acked {sum(p.acked for p in desc.partitions)}"
            )
        for dead in client.admin.list_dead_letters("orders"):
            print(f"dead letter {dead.id}: {dead.record.value!r} ({dead.reason})")


if __name__ == "__main__":
    main()
