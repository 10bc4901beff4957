"""What an operator said about a node: draining (move its replicas and leadership away),
leaving (the same, asked by the node's own stop, a Kubernetes preStop hook: it is active again
when it starts) or decommissioned (drained, and never placed on again). Kept as cluster settings
(``node_state.<node id>``, sealed with the cluster secret), so every node and the controller
read the same thing.

A node with no state is active. What a node *is* (live or missing, the groups it holds, the
groups it leads) comes from the directory, the group records and the leader records; the state
is only what it was asked to become.
"""

from __future__ import annotations

from collections.abc import Iterable

from fluxmq.metadata import MetadataStore

PREFIX = "node_state."
DRAINING = "draining"
LEAVING = "leaving"
DECOMMISSIONED = "decommissioned"
STATES = (DRAINING, LEAVING, DECOMMISSIONED)
ACTIVE = "active"  # stored to clear a state (any value that is not a state reads as active)


def setting_key(node_id: str) -> str:
    return PREFIX + node_id


async def read_states(store: MetadataStore, node_ids: Iterable[str]) -> dict[str, str]:
    """node id -> its state, for the nodes that have one (a value that is not a state is
    ignored: the node is treated as active)."""
    out = {}
    for node_id in sorted(set(node_ids)):
        value = await store.get_setting(setting_key(node_id))
        if value in STATES:
            out[node_id] = value
    return out


async def set_state(store: MetadataStore, node_id: str, state: str) -> None:
    assert state in (*STATES, ACTIVE), state
    await store.put_setting(setting_key(node_id), state)


async def ensure_not_leaving(store: MetadataStore, node_id: str) -> bool:
    """A node that starts is no longer leaving (its preStop drain was for the stop that
    came before this start). -> whether it was."""
    if await store.get_setting(setting_key(node_id)) != LEAVING:
        return False
    await set_state(store, node_id, ACTIVE)
    return True


def leaving(states: dict[str, str]) -> frozenset[str]:
    """Nodes whose replicas must move away (draining or decommissioned)."""
    return frozenset(n for n, s in states.items() if s in STATES)


PREFERRED_LEADER_PREFIX = "preferred_leader."  # <group> -> the node that should lead it


def preferred_leader_key(group_id: str) -> str:
    return PREFERRED_LEADER_PREFIX + group_id


def preference_value(node_id: str, expires_ms: int) -> str:
    return f"{node_id}@{expires_ms}"


def live_preference(value: str | None, now_ms: int) -> str | None:
    """The node a preference names while it holds (None: none, expired, or unreadable).

    >>> live_preference("node2@5000", 4000), live_preference("node2@5000", 6000)
    ('node2', None)
    """
    node_id, _, expires = (value or "").partition("@")
    if not node_id or not expires.isdigit() or now_ms >= int(expires):
        return None
    return node_id
