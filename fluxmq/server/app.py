"""Assembles the gRPC server of a node: QueueService, AdminService, health, reflection, the edge
interceptor."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fluxmq._pb.v1 import admin_pb2, queue_pb2
from fluxmq.server import admin_service, queue_service
from fluxmq.server.forwarding import RESPONSE_BYTES_MAX
from fluxmq.server.interceptors import EdgeInterceptor
from fluxmq.server.router import Router, RoutingInterceptor
from fluxmq.server.tls import TlsConfig

QUEUE_SERVICE = queue_pb2.DESCRIPTOR.services_by_name["QueueService"].full_name
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


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
    server = grpc.aio.server(
        # Edge first: it maps the errors of everything inside, routing included.
        interceptors=[
            EdgeInterceptor(
                router.catch_up,
                router.leader_address,
                lambda: router.guard,
                lambda: router.inflight,
            ),
            RoutingInterceptor(router),
        ],
        options=[
            ("grpc.max_receive_message_length", request_bytes_max),
            ("grpc.max_send_message_length", RESPONSE_BYTES_MAX),
            ("grpc.so_reuseport", 0),
        ],
    )
    queue_service.register(server, router)
    admin_service.register(server, router, node_id)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            QUEUE_SERVICE,
            ADMIN_SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, tls.server_credentials())
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return server, health_servicer, port


async def set_serving(
    health_servicer: health.aio.HealthServicer, serving: bool, *, queue_service: bool | None = None
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
