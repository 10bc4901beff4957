"""gRPC server reflection, as grpcurl and Postman use it, under both service names clients ask
for (``grpc.reflection.v1.ServerReflection`` and the older ``...v1alpha...``), answering with
FluxMQ's .proto files *with their comments*: ``grpcurl describe fluxmq.v1.QueueService.Publish``
shows what the contract says about the call.

The generated modules carry no comments (protoc leaves source info out of them), so the files
are served from ``fluxmq/_pb/descriptors_with_comments.binpb`` (tools/gen_proto.py writes it from
proto/ with its source info); anything else (well-known types, health, reflection itself) from
the descriptor pool as grpcio-reflection does. The v1 messages are the v1alpha ones under a new
package, field for field, so one servicer answers both.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE = reflection.SERVICE_NAME
DESCRIPTOR_SET = "descriptors_with_comments.binpb"


@functools.lru_cache(maxsize=1)
def commented_files() -> dict[str, bytes]:
    """File name -> its serialized FileDescriptorProto with source info (comments)."""
    data = resources.files("fluxmq._pb").joinpath(DESCRIPTOR_SET).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    return {f.name: f.SerializeToString() for f in files}


def _dependencies(descriptor: Any, seen: dict[str, Any]) -> dict[str, Any]:
    seen[descriptor.name] = descriptor
    for dependency in descriptor.dependencies:
        if dependency.name not in seen:
            _dependencies(dependency, seen)
    return seen


class ReflectionServicer(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    """grpcio-reflection's servicer, answering file requests with the commented files."""

    def _files_response(self, descriptor: Any, request: Any) -> Any:
        commented = commented_files()
        protos = []
        for name, d in _dependencies(descriptor, {}).items():
            serialized = commented.get(name)
            if serialized is None:
                proto = descriptor_pb2.FileDescriptorProto()
                d.CopyToProto(proto)
                serialized = proto.SerializeToString()
            protos.append(serialized)
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=protos
            ),
            original_request=request,
        )

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        try:
            descriptor = self._pool.FindFileByName(filename)
        except KeyError:
            return super()._file_by_filename(request, filename)  # its NOT_FOUND answer
        return self._files_response(descriptor, request)

    def _file_containing_symbol(self, request: Any, symbol: str) -> Any:
        try:
            descriptor = self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            return super()._file_containing_symbol(request, symbol)
        return self._files_response(descriptor, request)


def add_reflection(server: grpc.aio.Server, service_names: tuple[str, ...]) -> None:
    """Reflection for ``service_names`` (and itself) under the v1 and v1alpha names."""
    servicer = ReflectionServicer((*service_names, V1ALPHA_SERVICE, V1_SERVICE))
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for name in (V1ALPHA_SERVICE, V1_SERVICE):
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": method}),)
        )
