"""How the SDK proves who it is and protects the wire: an API key and TLS.

- **API key**: sent on every call as the gRPC metadata ``authorization: Bearer <key>`` (the
  ``api_key`` option, default ``$FLUXMQ_API_KEY``). Keys look like ``fmq_live_sk_`` /
  ``fmq_test_sk_`` followed by 32 base62 characters; the first 8 of those are the key's public
  id. The SDK never logs or shows a key: ``repr()`` and messages mask it as
  ``fmq_live_sk_<id>…``.
- **TLS**: with ``tls_ca_file`` (or ``tls_root_certificates``, PEM bytes; or ``tls=True`` for the
  system's roots) every channel the SDK opens — seeds, discovered nodes, leaders named by the
  broker — is a TLS channel that checks the node's certificate; ``tls_cert_file`` +
  ``tls_key_file`` add a client certificate (mutual TLS).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

API_KEY_ENV = "FLUXMQ_API_KEY"
AUTHORIZATION = "authorization"
KEY_PREFIXES = ("fmq_live_sk_", "fmq_test_sk_")
KEY_ID_CHARS = 8
HIDDEN = "<hidden>"

PathLike = str | os.PathLike[str]


def mask_key(key: str) -> str:
    """What may be shown of a key: its prefix and public id (``fmq_live_sk_AbCd1234…``); a
    value not shaped like a FluxMQ key shows nothing of itself."""
    for prefix in KEY_PREFIXES:
        rest = key[len(prefix) :]
        if key.startswith(prefix) and len(rest) > KEY_ID_CHARS and rest[:KEY_ID_CHARS].isalnum():
            return f"{prefix}{rest[:KEY_ID_CHARS]}…"
    return HIDDEN


def resolve_api_key(api_key: str | None, env: Mapping[str, str] | None = None) -> str:
    """The key to send: ``api_key`` if given (``""`` = none, whatever the environment says),
    else ``$FLUXMQ_API_KEY``; surrounding whitespace (a file's newline) is dropped."""
    if api_key is None:
        api_key = (os.environ if env is None else env).get(API_KEY_ENV, "")
    key = api_key.strip()
    # A header value is printable ASCII: anything else would make every call fail obscurely.
    if key and not all(" " < c <= "~" for c in key):
        raise ValueError(
            f"api_key {mask_key(key)}: only printable ASCII without spaces (is it a FluxMQ key?)"
        )
    return key


def _read(path: PathLike, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"{option} {os.fspath(path)}: {err.strerror or err}") from None


class Credentials:
    """The API key and TLS settings of one client (``repr`` shows the masked key only)."""

    __slots__ = ("_channel_credentials", "_metadata", "key_hint", "mtls", "tls")

    def __init__(
        self,
        *,
        api_key: str | None = None,
        tls: bool | None = None,
        tls_ca_file: PathLike | None = None,
        tls_root_certificates: bytes | None = None,
        tls_cert_file: PathLike | None = None,
        tls_key_file: PathLike | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        key = resolve_api_key(api_key, env)
        self.key_hint = mask_key(key) if key else ""
        self._metadata: tuple[tuple[str, str], ...] | None = (
            ((AUTHORIZATION, f"Bearer {key}"),) if key else None
        )
        if tls_ca_file is not None and tls_root_certificates is not None:
            raise ValueError("give tls_ca_file or tls_root_certificates, not both")
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file: give both (mutual TLS) or neither")
        wants_tls = any(x is not None for x in (tls_ca_file, tls_root_certificates, tls_cert_file))
        if tls is False and wants_tls:
            raise ValueError("tls=False contradicts the tls_* options given")
        self.tls = bool(tls) or wants_tls
        self.mtls = tls_cert_file is not None
        self._channel_credentials: grpc.ChannelCredentials | None = None
        if self.tls:
            roots = tls_root_certificates
            if tls_ca_file is not None:
                roots = _read(tls_ca_file, "tls_ca_file")
            chain = _read(tls_cert_file, "tls_cert_file") if tls_cert_file is not None else None
            private = _read(tls_key_file, "tls_key_file") if tls_key_file is not None else None
            self._channel_credentials = grpc.ssl_channel_credentials(
                root_certificates=roots, private_key=private, certificate_chain=chain
            )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The metadata every call carries (None without a key)."""
        return self._metadata

    def channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
        """A ``grpc.aio`` channel to ``address``: TLS when configured, else plaintext."""
        if self._channel_credentials is not None:
            return grpc.aio.secure_channel(address, self._channel_credentials, options=options)
        return grpc.aio.insecure_channel(address, options=options)

    def __repr__(self) -> str:
        parts = [f"api_key={self.key_hint or None}", f"tls={self.tls}"]
        if self.mtls:
            parts.append("mtls=True")
        return f"Credentials({', '.join(parts)})"

    def __reduce__(self) -> Any:  # never pickled (it would carry the key)
        raise TypeError("Credentials cannot be pickled")
