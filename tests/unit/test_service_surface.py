"""Every RPC of the contract is served: the generated base classes (fluxmq/_pb, written by
tools/gen_proto.py, never edited) answer UNIMPLEMENTED (NotImplementedError) for any method a
servicer forgets to override; these tests make sure none is left to them."""

from __future__ import annotations

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.server.admin_service import AdminService
from fluxmq.server.queue_service import QueueService


def test_every_queue_service_rpc_is_implemented() -> None:
    rpcs = pb.DESCRIPTOR.services_by_name["QueueService"].methods_by_name
    base = queue_pb2_grpc.QueueServiceServicer
    missing = [name for name in rpcs if getattr(QueueService, name) is getattr(base, name)]
    assert not missing, f"RPCs without an implementation: {missing}"
    assert len(rpcs) == 33


def test_every_admin_service_rpc_is_implemented() -> None:
    rpcs = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].methods_by_name
    base = admin_pb2_grpc.AdminServiceServicer
    missing = [name for name in rpcs if getattr(AdminService, name) is getattr(base, name)]
    assert not missing, f"RPCs without an implementation: {missing}"
    assert len(rpcs) == 13
