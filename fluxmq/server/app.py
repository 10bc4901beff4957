"""Assembles the gRPC server of a node: QueueService, AdminService, health, reflection, the edge
interceptor."""

from __future__ import annotations

from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fluxmq._pb.v1 import admin_pb2, queue_pb2
from fluxmq.server import admin_service, queue_service
from fluxmq.server.forwarding import RESPONSE_BYTES_MAX
from fluxmq.server.interceptors import EdgeInterceptor
from fluxmq.server.reflection import add_reflection
from fluxmq.server.router import Router, RoutingInterceptor
from fluxmq.server.tls import TlsConfig

QUEUE_SERVICE = queue_pb2.DESCRIPTOR.services_by_name["QueueService"].full_name
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


def interceptors(router: Router) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors around every call a node serves, on its gRPC port or relayed to its
    shard process: edge first, as it maps the errors of everything inside, routing included."""
    return [
        EdgeInterceptor(
            router.catch_up,
            router.leader_address,
            lambda: router.guard,
            lambda: router.inflight,
        ),
        RoutingInterceptor(router),
    ]


def register_services(server: Any, router: Router, node_id: str) -> None:
    """QueueService and AdminService on ``server`` (a grpc.aio.Server or a shard process's
    FramedServer, which takes handlers the same way)."""
    queue_service.register(server, router)
    admin_service.register(server, router, node_id)


class HealthSink(Protocol):
    """Where serving statuses go: the gRPC port's health service, or, in a shard process, the
    front end's (through the channel)."""

    async def set(
        self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType
    ) -> None: ...


def build_server(
    router: Router,
    listen: str,
    *,
    request_bytes_max: int,
    node_id: str = "local",
    tls: TlsConfig | None = None,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """-> (server, health servicer, bound port). The server is not started; ``router`` knows
    the node's shards (they may be added until it starts). ``node_id`` names this node in
    AdminService answers. With ``tls`` the port speaks TLS only (plaintext clients fail their
    handshake), and requires client certificates when ``tls.client_auth``."""
    server = public_server(request_bytes_max, interceptors(router))
    register_services(server, router, node_id)
    health_servicer = add_health_and_reflection(server)
    return server, health_servicer, bind(server, listen, tls)


def public_server(
    request_bytes_max: int, server_interceptors: list[grpc.aio.ServerInterceptor]
) -> grpc.aio.Server:
    return grpc.aio.server(
        interceptors=server_interceptors,
        options=[
            ("grpc.max_receive_message_length", request_bytes_max),
            ("grpc.max_send_message_length", RESPONSE_BYTES_MAX),
            ("grpc.so_reuseport", 0),
        ],
    )


def add_health_and_reflection(server: grpc.aio.Server) -> health.aio.HealthServicer:
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    add_reflection(
        server,
        (
            QUEUE_SERVICE,
            ADMIN_SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        ),
    )
    return health_servicer


def bind(server: grpc.aio.Server, listen: str, tls: TlsConfig | None) -> int:
    """-> the bound port (OSError: cannot listen)."""
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, tls.server_credentials())
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return int(port)


async def set_serving(
    health_servicer: HealthSink, serving: bool, *, queue_service: bool | None = None
) -> None:
    """gRPC health per service: the server ("") and AdminService while the process serves;
    QueueService follows readiness when ``queue_service`` is given (a node that is catching up
    or shutting down answers admin calls but should not get queue traffic)."""

    def code(up: bool) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
        return (
            health_pb2.HealthCheckResponse.SERVING
            if up
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )

    await health_servicer.set("", code(serving))
    await health_servicer.set(ADMIN_SERVICE, code(serving))
    await health_servicer.set(
        QUEUE_SERVICE, code(serving if queue_service is None else queue_service)
    )


class Edge(Protocol):
    """Where a node's calls come in: its own gRPC port (``GrpcEdge``), or, in a shard process,
    the channel from the front end that owns the port (``FramedEdge``)."""

    port: int
    health: HealthSink

    async def start(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


class GrpcEdge:
    def __init__(self, server: grpc.aio.Server, health_servicer: HealthSink, port: int) -> None:
        self.server = server
        self.health = health_servicer
        self.port = port

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace_s: float) -> None:
        await self.server.stop(grace_s)
