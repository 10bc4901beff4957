"""``python -m fluxmq.metadata.etcd_auth``: turn on etcd's authentication for a FluxMQ cluster.

The deployments (deploy/compose, deploy/k8s) run it once after etcd starts, as etcd's ``root``
(a client certificate whose common name is ``root``): it creates the users ``root`` and
``--user`` (default ``fluxmq``) without passwords, so that only their client certificates
(etcd ``--client-cert-auth``) authenticate them, gives ``--user`` read-write on the cluster's
``--prefix`` only, and enables authentication. Every step is idempotent: a restart of the job,
or a run against an etcd already set up, changes nothing and succeeds. etcd must be reachable
within ``--wait-s`` seconds (it may still be starting).

Exit codes: 0 done, 1 an error (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence

import aetcd.rpc as rpc
import grpc

ROOT = "root"
RETRY_S = 0.5
CALL_TIMEOUT_S = 5.0
_EXISTS = ("already exists",)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


async def _idempotent(call: Callable[[], Awaitable[object]]) -> None:
    """Runs one step; "already exists" means an earlier run did it."""
    try:
        await call()
    except grpc.aio.AioRpcError as e:
        if not any(text in (e.details() or "") for text in _EXISTS):
            raise


async def _wait_reachable(stub: rpc.AuthStub, wait_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            await stub.RoleList(rpc.AuthRoleListRequest(), timeout=CALL_TIMEOUT_S)
            return
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or loop.time() > deadline:
                raise
            await asyncio.sleep(RETRY_S)


async def enable_auth(
    endpoint: str, ca_file: str, cert_file: str, key_file: str, user: str, prefix: str,
    wait_s: float = 60.0,
) -> None:  # fmt: skip
    """Users root and ``user`` (certificate-only), ``user`` read-write on ``prefix``, auth on."""
    credentials = grpc.ssl_channel_credentials(_read(ca_file), _read(key_file), _read(cert_file))
    async with grpc.aio.secure_channel(endpoint, credentials) as channel:
        stub = rpc.AuthStub(channel)
        await _wait_reachable(stub, wait_s)
        no_password = rpc.UserAddOptions(no_password=True)
        t = CALL_TIMEOUT_S
        for name in (ROOT, user):
            request = rpc.AuthUserAddRequest(name=name, options=no_password)
            await _idempotent(lambda r=request: stub.UserAdd(r, timeout=t))  # type: ignore[misc]
        await _idempotent(
            lambda: stub.UserGrantRole(
                rpc.AuthUserGrantRoleRequest(user=ROOT, role=ROOT), timeout=t
            )
        )
        await _idempotent(lambda: stub.RoleAdd(rpc.AuthRoleAddRequest(name=user), timeout=t))
        key = prefix.encode()
        permission = rpc.Permission(permType=rpc.Permission.READWRITE, key=key,
                                    range_end=_prefix_end(key))  # fmt: skip
        await stub.RoleGrantPermission(
            rpc.AuthRoleGrantPermissionRequest(name=user, perm=permission), timeout=t
        )
        await _idempotent(
            lambda: stub.UserGrantRole(
                rpc.AuthUserGrantRoleRequest(user=user, role=user), timeout=t
            )
        )
        # etcd ignores a second enable (and 3.4 has no AuthStatus to ask first).
        await stub.AuthEnable(rpc.AuthEnableRequest(), timeout=t)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fluxmq.metadata.etcd_auth",
        description="Enable etcd authentication for FluxMQ: certificate-only users root and "
        "--user, the latter read-write on --prefix. Idempotent.",
    )
    parser.add_argument("--endpoint", required=True, help="etcd host:port (TLS)")
    parser.add_argument("--ca-file", required=True, help="CA that signs etcd's certificate")
    parser.add_argument("--cert-file", required=True, help="client certificate with CN root")
    parser.add_argument("--key-file", required=True, help="its private key")
    parser.add_argument("--user", default="fluxmq", help="the nodes' etcd user (their CN)")
    parser.add_argument("--prefix", default="/fluxmq/", help="the cluster's etcd_prefix")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long etcd may take")
    args = parser.parse_args(argv)
    if not (args.prefix.startswith("/") and args.prefix.endswith("/") and len(args.prefix) > 1):
        print(f"etcd_auth: --prefix {args.prefix!r} must start and end with '/'", file=sys.stderr)
        return 1
    try:
        asyncio.run(
            enable_auth(
                args.endpoint, args.ca_file, args.cert_file, args.key_file, args.user,
                args.prefix, args.wait_s,
            )
        )  # fmt: skip
    except OSError as e:
        print(f"etcd_auth: cannot read {e.filename!r}: {e.strerror}", file=sys.stderr)
        return 1
    except grpc.aio.AioRpcError as e:
        print(
            f"etcd_auth: etcd at {args.endpoint}: {e.code().name}: {e.details()}", file=sys.stderr
        )
        return 1
    print(f"etcd_auth: authentication on; user {args.user!r} may read and write {args.prefix}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
