"""FluxMQ Python SDK: ``AsyncClient`` (asyncio) and ``Client`` (blocking).

Publish, consume with a handler, stop gracefully (against ``make run``'s 127.0.0.1:7070)::

    import asyncio

    from fluxmq.client import AsyncClient

    async def main() -> None:
        async with AsyncClient("127.0.0.1:7070") as client:
            await client.admin.create_queue("jobs", type="work", exist_ok=True)
            await client.publish("jobs", {"resize": "photo-1.jpg"}, key="user-7")

            stop = asyncio.Event()

            async def handle(msg):  # success acks; an exception nacks (retried, then DLQ)
                print(msg.data, msg.partition, msg.offset, msg.attempt)
                stop.set()

            await client.consume("jobs", "workers", handle, codec="json", stop=stop,
                                 create_group=True)

    asyncio.run(main())

The blocking client has the same methods::

    from fluxmq.client import Client

    with Client() as client:  # $FLUXMQ_ADDR or 127.0.0.1:7070
        client.publish("jobs", b"hello")
        with client.consumer("jobs", "workers") as consumer:
            for msg in consumer:
                print(msg.value)
                msg.ack()
                break

Against a broker with API keys and TLS (``api_key`` defaults to ``$FLUXMQ_API_KEY``)::

    AsyncClient("broker:7070", api_key="fmq_live_sk_...", tls_ca_file="ca.pem")

The SDK imports only grpc, the generated stubs (``fluxmq._pb``) and the standard library.
"""

from fluxmq.client._security import mask_key
from fluxmq.client._transport import NO_RETRY, RetryPolicy
from fluxmq.client.admin import Admin
from fluxmq.client.buffered import BufferedProducer
from fluxmq.client.client import AsyncClient, Client, ClientStats
from fluxmq.client.codecs import Codec, get_codec
from fluxmq.client.consumer import Consumer, ConsumerStats, Message
from fluxmq.client.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FieldViolation,
    FluxMQError,
    GroupExists,
    GroupNotFound,
    InvalidArgument,
    MessageTooLarge,
    NotFound,
    PermissionDenied,
    QueueExists,
    QueueNotFound,
    RateLimited,
    StaleGeneration,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from fluxmq.client.producer import OutgoingMessage, PublishResult
from fluxmq.client.reader import StreamReader, StreamRecord
from fluxmq.client.tail import Tail

__all__ = [
    "NO_RETRY",
    "Admin",
    "AlreadyExists",
    "AsyncClient",
    "BufferedProducer",
    "Client",
    "ClientStats",
    "Codec",
    "Consumer",
    "ConsumerStats",
    "DeadlineExceeded",
    "FieldViolation",
    "FluxMQError",
    "GroupExists",
    "GroupNotFound",
    "InvalidArgument",
    "Message",
    "MessageTooLarge",
    "NotFound",
    "OutgoingMessage",
    "PermissionDenied",
    "PublishResult",
    "QueueExists",
    "QueueNotFound",
    "RateLimited",
    "RetryPolicy",
    "StaleGeneration",
    "StreamReader",
    "StreamRecord",
    "Tail",
    "Unauthenticated",
    "Unavailable",
    "from_rpc_error",
    "get_codec",
    "mask_key",
]
