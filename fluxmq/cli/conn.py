"""Where the broker is and how fluxmqctl talks to it.

The address comes from ``--server``, else ``FLUXMQ_ADDR``, else the profile file
(``FLUXMQ_PROFILE`` or ``~/.config/fluxmq/profile.toml``, key ``server``), else
``127.0.0.1:7070``; it may list several nodes (``a:7070,b:7070``): the first that accepts a
connection is used. A failed call becomes a ``CliError``: one line with the broker's reason, its
message, the request id and any field violations, and the exit code scripts rely on.

Security: every call carries ``authorization: Bearer <key>`` when an API key is given
(``--api-key``, else ``FLUXMQ_API_KEY``); the key is never printed (errors show it masked as
``fmq_live_sk_<id>…``). ``--tls-ca`` (a PEM CA bundle; else ``tls_ca`` in the profile) or
``--tls`` (the system's roots) make every channel TLS; ``--tls-cert`` + ``--tls-key`` add a
client certificate (mutual TLS). A call the broker rate-limits (RESOURCE_EXHAUSTED with a
RetryInfo) is repeated after the advised delay, a few times.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq.cli.output import Printer

DEFAULT_SERVER = "127.0.0.1:7070"
DEFAULT_TIMEOUT_S = 10.0
ADDR_ENV = "FLUXMQ_ADDR"
PROFILE_ENV = "FLUXMQ_PROFILE"
DEFAULT_PROFILE = "~/.config/fluxmq/profile.toml"
PROFILE_KEYS = ("server", "timeout", "output", "tls_ca", "tls_cert", "tls_key")
API_KEY_ENV = "FLUXMQ_API_KEY"
KEY_PREFIXES = ("fmq_live_sk_", "fmq_test_sk_")
KEY_ID_CHARS = 8
RATE_LIMIT_TRIES = 5  # attempts of a rate-limited call (RESOURCE_EXHAUSTED with RetryInfo)
RATE_LIMIT_MAX_WAIT_S = 30.0  # a longer advised delay is not waited for
CONNECT_PROBE_S = 3.0  # with several addresses: how long each gets to accept a connection

EXIT_OK = 0
EXIT_REFUSED = 1  # the broker answered with an error (or the command failed otherwise)
EXIT_USAGE = 2  # bad usage: argparse's code
EXIT_UNREACHABLE = 3  # UNAVAILABLE / DEADLINE_EXCEEDED: the broker could not be reached in time
EXIT_INTERRUPTED = 130

_ADDRESS_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$")
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]
_SETTLED = (
    grpc.ChannelConnectivity.READY,
    grpc.ChannelConnectivity.TRANSIENT_FAILURE,
    grpc.ChannelConnectivity.SHUTDOWN,
)
_TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class CliError(Exception):
    """Ends the command: ``error: <message>`` on one line of stderr, and ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED, reason: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason  # the broker's ErrorInfo reason (QUEUE_EXISTS...), when it answered

    @property
    def line(self) -> str:
        return "error: " + " ".join(str(self).split())


class UsageError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


@dataclass(frozen=True)
class Profile:
    server: str | None = None
    timeout: float | None = None
    output: str | None = None
    path: Path | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


def load_profile(env: Mapping[str, str]) -> Profile:
    explicit = env.get(PROFILE_ENV, "")
    path = Path(explicit or DEFAULT_PROFILE).expanduser()
    if not path.is_file():
        if explicit:
            raise UsageError(f"{PROFILE_ENV}={explicit}: no such file")
        return Profile()
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"profile {path}: {err}") from None
    unknown = sorted(set(data) - set(PROFILE_KEYS))
    if unknown:
        raise UsageError(
            f"profile {path}: unknown key(s) {', '.join(unknown)}; known: "
            + ", ".join(PROFILE_KEYS)
        )
    server, timeout, output = data.get("server"), data.get("timeout"), data.get("output")
    for name in ("tls_ca", "tls_cert", "tls_key"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise UsageError(f"profile {path}: {name} must be a file name (a string)")
    if server is not None and not isinstance(server, str):
        raise UsageError(f'profile {path}: server must be a string like "host:7070"')
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise UsageError(f"profile {path}: timeout must be a positive number of seconds")
    if output is not None and output not in ("table", "json", "jsonl"):
        raise UsageError(f'profile {path}: output must be "table", "json" or "jsonl"')
    return Profile(
        server=server,
        timeout=float(timeout) if timeout is not None else None,
        output=output,
        path=path,
        tls_ca=data.get("tls_ca"),
        tls_cert=data.get("tls_cert"),
        tls_key=data.get("tls_key"),
    )


def parse_servers(text: str, source: str) -> list[str]:
    """``host:port[,host:port...]`` -> the addresses, each checked for shape."""
    servers = [s.strip() for s in text.split(",") if s.strip()]
    if not servers:
        raise UsageError(f"{source}: no address given (host:port)")
    for s in servers:
        if not _ADDRESS_RE.match(s) or not 0 < int(s.rpartition(":")[2]) < 65536:
            raise UsageError(f"{source}: {s!r} is not host:port")
    return servers


def resolve_servers(flag: str | None, env: Mapping[str, str], profile: Profile) -> list[str]:
    if flag is not None:
        return parse_servers(flag, "--server")
    if env.get(ADDR_ENV):
        return parse_servers(env[ADDR_ENV], ADDR_ENV)
    if profile.server is not None:
        return parse_servers(profile.server, f"profile {profile.path} server")
    return [DEFAULT_SERVER]


def mask_key(key: str) -> str:
    """What may be shown of an API key: ``fmq_live_sk_<first 8>…``; nothing of anything else."""
    for prefix in KEY_PREFIXES:
        rest = key[len(prefix) :]
        if key.startswith(prefix) and len(rest) > KEY_ID_CHARS and rest[:KEY_ID_CHARS].isalnum():
            return f"{prefix}{rest[:KEY_ID_CHARS]}…"
    return "<hidden>"


@dataclass(frozen=True)
class Security:
    """The API key and the TLS material (PEM bytes) of every channel fluxmqctl opens."""

    api_key: str = field(default="", repr=False)
    tls: bool = False
    root_certificates: bytes | None = field(default=None, repr=False)
    certificate_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else None

    def channel(self, address: str) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )
        return grpc.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)

    def redact(self, text: str) -> str:
        """``text`` with the key masked wherever it appears."""
        return text.replace(self.api_key, mask_key(self.api_key)) if self.api_key else text

    def __repr__(self) -> str:
        key = mask_key(self.api_key) if self.api_key else None
        return f"Security(api_key={key}, tls={self.tls})"


def _pem(path: str, source: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as err:
        raise UsageError(f"{source} {path}: {err.strerror or err}") from None


def resolve_security(
    *,
    api_key: str | None,
    tls: bool,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    env: Mapping[str, str],
    profile: Profile,
) -> Security:
    """The key (``--api-key``, else ``FLUXMQ_API_KEY``) and TLS files (flags, else the
    profile's ``tls_ca`` / ``tls_cert`` / ``tls_key``), read now: a missing file is a usage
    error."""
    source = "--api-key" if api_key is not None else API_KEY_ENV
    key = (api_key if api_key is not None else env.get(API_KEY_ENV, "")).strip()
    if key and not all(" " < c <= "~" for c in key):
        raise UsageError(f"{source}: {mask_key(key)} is not an API key (printable ASCII only)")
    ca = tls_ca if tls_ca is not None else profile.tls_ca
    cert = tls_cert if tls_cert is not None else profile.tls_cert
    private = tls_key if tls_key is not None else profile.tls_key
    if bool(cert) != bool(private):
        raise UsageError("--tls-cert and --tls-key: give both (mutual TLS) or neither")
    return Security(
        api_key=key,
        tls=tls or bool(ca or cert),
        root_certificates=_pem(ca, "--tls-ca") if ca else None,
        certificate_chain=_pem(cert, "--tls-cert") if cert else None,
        private_key=_pem(private, "--tls-key") if private else None,
    )


def _retry_after_s(err: grpc.RpcError) -> float | None:
    """The RetryInfo delay of a RESOURCE_EXHAUSTED answer (RATE_LIMITED), else None."""
    code_fn = getattr(err, "code", None)
    if not callable(code_fn) or code_fn() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    try:
        status = rpc_status.from_call(err)
    except (ValueError, AttributeError, TypeError):
        return None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToMilliseconds()) / 1000
    return None


def rpc_failure(err: grpc.RpcError, address: str, timeout_s: float | None) -> CliError:
    """One line for a failed call: the broker's reason (ErrorInfo; else the gRPC code), its
    message, the request id and any field violations."""
    code_fn = getattr(err, "code", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or ""
    reason = code.name
    request_id = ""
    violations: list[str] = []
    answered = False  # the broker itself sent the error (with its ErrorInfo)
    trailers_fn = getattr(err, "trailing_metadata", None)
    for key, value in (trailers_fn() if callable(trailers_fn) else None) or ():
        if key == "x-request-id":
            request_id = value.decode() if isinstance(value, bytes) else str(value)
    try:
        status = rpc_status.from_call(err)
    except (ValueError, AttributeError, TypeError):
        status = None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            answered = True
            reason = info.reason or reason
            request_id = request_id or info.metadata.get("request_id", "")
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.extend(f"{v.field}: {v.description}" for v in bad.field_violations)
    if code == grpc.StatusCode.UNAVAILABLE and not answered:
        message = f"cannot reach the broker at {address}: {details}"
        if any(w in details.lower() for w in ("ssl", "handshake", "certificate", "tls")):
            message += " (TLS: check --tls-ca, --tls-cert / --tls-key)"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and not answered:
        waited = f" within {timeout_s:g} s" if timeout_s is not None else ""
        message = f"no answer from the broker at {address}{waited} (--timeout)"
    else:
        message = details or code.name
    line = f"{reason}: {message}"
    retry_after = _retry_after_s(err)
    if retry_after is not None:
        line += f" (retry after {retry_after:g} s)"
    if request_id:
        line += f" (request id {request_id})"
    extra = [v for v in violations if v not in message]  # often the message already says it
    if extra:
        line += "; " + "; ".join(extra)
    exit_code = EXIT_UNREACHABLE if code in _TRANSPORT_CODES else EXIT_REFUSED
    return CliError(line, exit_code, reason if answered else "")


def _connects(channel: grpc.Channel, timeout_s: float) -> bool:
    """Whether the channel gets connected within ``timeout_s`` (a refused connection says so at
    once, where waiting for readiness would take the whole timeout)."""
    settled = threading.Event()
    seen: list[grpc.ChannelConnectivity] = []

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state in _SETTLED:
            seen.append(state)
            settled.set()

    channel.subscribe(watch, try_to_connect=True)
    try:
        settled.wait(timeout_s)
    finally:
        channel.unsubscribe(watch)
    return bool(seen) and seen[0] == grpc.ChannelConnectivity.READY


class Connection:
    """A channel to the first of ``servers`` that answers, opened on first use, with the
    ``security`` settings (API key, TLS)."""

    def __init__(
        self, servers: list[str], timeout_s: float, security: Security | None = None
    ) -> None:
        self.servers = servers
        self.timeout_s = timeout_s
        self.security = security or Security()
        self.address = servers[0]
        self._channel: grpc.Channel | None = None
        self._queues: Any = None
        self._admin: Any = None

    def _open(self) -> grpc.Channel:
        if self._channel is not None:
            return self._channel
        if len(self.servers) == 1:
            self._channel = self.security.channel(self.address)
            return self._channel
        for address in self.servers:
            channel = self.security.channel(address)
            if not _connects(channel, min(self.timeout_s, CONNECT_PROBE_S)):
                channel.close()
                continue
            self.address = address
            self._channel = channel
            return channel
        raise CliError(
            f"UNAVAILABLE: cannot reach any of {', '.join(self.servers)}", EXIT_UNREACHABLE
        )

    @property
    def queues(self) -> Any:
        """The QueueService stub."""
        if self._queues is None:
            self._queues = queue_pb2_grpc.QueueServiceStub(self._open())  # type: ignore[no-untyped-call]
        return self._queues

    @property
    def admin(self) -> Any:
        """The AdminService stub."""
        if self._admin is None:
            self._admin = admin_pb2_grpc.AdminServiceStub(self._open())  # type: ignore[no-untyped-call]
        return self._admin

    def _failure(self, err: grpc.RpcError, timeout_s: float | None) -> CliError:
        failure = rpc_failure(err, self.address, timeout_s)
        return CliError(self.security.redact(str(failure)), failure.exit_code, failure.reason)

    def call(self, method: Callable[..., Any], request: Any, *, wait_s: float = 0.0) -> Any:
        """A unary call with the deadline ``--timeout`` (plus ``wait_s`` for long polls); a
        rate-limited call is repeated after the broker's RetryInfo delay, a few times."""
        timeout = self.timeout_s + wait_s
        tries = 0
        while True:
            tries += 1
            try:
                return method(request, timeout=timeout, metadata=self.security.metadata)
            except grpc.RpcError as err:
                delay = _retry_after_s(err)
                if delay is None or tries >= RATE_LIMIT_TRIES or delay > RATE_LIMIT_MAX_WAIT_S:
                    raise self._failure(err, timeout) from None
            time.sleep(delay)

    def stream(self, method: Callable[..., Any], request: Any) -> Generator[Any, None, None]:
        """A server stream without deadline (it ends with the command); cancelled on exit.

        Ctrl-C while it runs cancels the call and surfaces as KeyboardInterrupt from here: a
        KeyboardInterrupt raised inside gRPC's own waiting can be swallowed by its C core, which
        would leave the command running."""
        call = method(request, metadata=self.security.metadata)
        INTERRUPT.streaming(call)
        try:
            yield from call
        except grpc.RpcError as err:
            if INTERRUPT.fired:
                raise KeyboardInterrupt from None
            raise self._failure(err, None) from None
        finally:
            INTERRUPT.streaming(None)
            call.cancel()
        if INTERRUPT.fired:
            raise KeyboardInterrupt

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class Interrupt:
    """The SIGINT handler of fluxmqctl: a plain KeyboardInterrupt, except while a server stream
    runs, when it cancels the stream (the stream then raises KeyboardInterrupt itself)."""

    def __init__(self) -> None:
        self.fired = False
        self._call: Any = None

    def streaming(self, call: Any) -> None:
        self._call = call

    def handle(self, signum: int, frame: object) -> None:
        self.fired = True
        call = self._call
        if call is None:
            raise KeyboardInterrupt
        call.cancel()


INTERRUPT = Interrupt()


@dataclass
class Context:
    """What every command gets: the connection, the printer and the global settings."""

    conn: Connection
    out: Printer
    servers: list[str]
    timeout_s: float
    security: Security = field(default_factory=Security)

    def close(self) -> None:
        self.conn.close()


def confirm(question: str, yes: bool) -> None:
    """Returns once the user agreed (or passed ``--yes``). Off a terminal there is nobody to
    ask: a usage error."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question} Add --yes to confirm (stdin is not a terminal)")
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise CliError("aborted: nothing was changed")
