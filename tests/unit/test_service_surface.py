"""Every RPC of the contract is served: the generated base class answers UNIMPLEMENTED
(NotImplementedError) for any method QueueService forgets to override."""

from __future__ import annotations

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.server.queue_service import QueueService


def test_every_queue_service_rpc_is_implemented() -> None:
    rpcs = pb.DESCRIPTOR.services_by_name["QueueService"].methods_by_name
    base = queue_pb2_grpc.QueueServiceServicer
    missing = [name for name in rpcs if getattr(QueueService, name) is getattr(base, name)]
    assert not missing, f"RPCs without an implementation: {missing}"
    assert len(rpcs) == 31
