"""TLS of the gRPC port, for clients and for the calls nodes forward to each other.

The PEM files are read and checked once, at start: a file that is not what its setting says, a
key that does not belong to the certificate or a certificate that expired stops the node with a
message naming the setting. With a certificate the port speaks TLS only. The same certificate is
the node's client certificate when it forwards a call to another node, so with
``tls_client_auth`` (mTLS) every node must trust the CA of the others (``tls_ca_file``).

Other nodes and clients verify the certificate against the host they dial: the node's advertised
address (``advertise``, default ``listen``), so the certificate must name that host in its
subject alternative names (a DNS name, or an IP address for an IP).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID

from fluxmq.config import ConfigError, NodeConfig

log = logging.getLogger("fluxmq")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert_chain: bytes  # PEM: the node's certificate first, then any intermediates
    private_key: bytes  # PEM, unencrypted
    root_certificates: bytes | None  # PEM CA bundle; None: the system's roots (outgoing only)
    client_auth: bool  # mTLS: clients must present a certificate signed by root_certificates

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.root_certificates if self.client_auth else None,
            require_client_auth=self.client_auth,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """For calls to other nodes: verifies them with the CA bundle (else the system's roots)
        and presents this node's certificate, which peers requiring mTLS ask for."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.cert_chain,
        )

    @property
    def mode(self) -> str:
        return "mTLS" if self.client_auth else "TLS"


def describe(tls: TlsConfig | None) -> str:
    """For the startup log line: "serving on host:port over TLS"."""
    return "plaintext (no TLS)" if tls is None else tls.mode


def _read(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise ConfigError(f"{name}: cannot read {path!r}: {err.strerror}") from None


def _certificates(name: str, path: str, data: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise ConfigError(
            f"{name}: {path!r} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)"
        )
    return certs


def _private_key(path: str, data: bytes) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:  # encrypted: gRPC cannot ask for a passphrase
        raise ConfigError(
            f"tls_key_file: the key in {path!r} is encrypted; gRPC needs it unencrypted "
            "(openssl pkey -in key.pem -out plain.pem), kept readable by this node only"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as err:
        raise ConfigError(
            f"tls_key_file: {path!r} holds no PEM private key "
            f"(expected -----BEGIN PRIVATE KEY-----): {err}"
        ) from None


def _same_key(key: PrivateKeyTypes, cert: x509.Certificate) -> bool:
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(der, spki) == cert.public_key().public_bytes(der, spki)


def _extended_key_usage(cert: x509.Certificate) -> set[x509.ObjectIdentifier] | None:
    try:
        return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None  # no restriction


def names_host(cert: x509.Certificate, host: str) -> bool:
    """Whether ``cert``'s subject alternative names cover ``host`` (an IP or a DNS name; a
    wildcard stands for one leftmost label), as a gRPC client checks it."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if ip is not None:
        return ip in san.get_values_for_type(x509.IPAddress)
    host = host.lower().rstrip(".")
    for name in san.get_values_for_type(x509.DNSName):
        name = name.lower().rstrip(".")
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


def load(
    cert_file: str,
    key_file: str,
    ca_file: str = "",
    client_auth: bool = False,
    *,
    advertised_host: str = "",
    now: datetime.datetime | None = None,
) -> TlsConfig | None:
    """The checked TLS material of a node (None without a certificate: plaintext). Raises
    ConfigError naming the setting; logs a warning for what only may go wrong (a certificate
    that does not name the advertised host, or that the CA bundle did not sign)."""
    if not cert_file and not key_file:
        if client_auth:
            raise ConfigError("tls_client_auth: needs tls_cert_file, tls_key_file and tls_ca_file")
        return None
    if not cert_file or not key_file:
        raise ConfigError("tls_cert_file and tls_key_file: set both or neither")
    if client_auth and not ca_file:
        raise ConfigError("tls_client_auth: needs tls_ca_file (the CA that signs client certs)")
    cert_pem = _read("tls_cert_file", cert_file)
    key_pem = _read("tls_key_file", key_file)
    chain = _certificates("tls_cert_file", cert_file, cert_pem)
    leaf = chain[0]
    key = _private_key(key_file, key_pem)
    if not _same_key(key, leaf):
        raise ConfigError(
            f"tls_key_file: the key in {key_file!r} does not belong to the certificate in "
            f"tls_cert_file {cert_file!r} (the first certificate of the file is the node's)"
        )
    now = now or datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc < now:
        raise ConfigError(
            f"tls_cert_file: the certificate in {cert_file!r} expired on "
            f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if leaf.not_valid_before_utc > now:
        log.warning(
            "tls_cert_file: the certificate in %r is valid only from %s UTC (clock skew?)",
            cert_file,
            f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M}",
        )
    usage = _extended_key_usage(leaf)
    if usage is not None and ExtendedKeyUsageOID.SERVER_AUTH not in usage:
        raise ConfigError(
            f"tls_cert_file: the certificate in {cert_file!r} is not for servers (its extended "
            "key usage lacks serverAuth)"
        )
    if usage is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        # A forwarding node presents this certificate as its client certificate.
        message = (
            f"tls_cert_file: the certificate in {cert_file!r} lacks the clientAuth extended key "
            "usage, so nodes requiring client certificates (tls_client_auth) refuse the calls "
            "this node forwards to them"
        )
        if client_auth:
            raise ConfigError(message)
        log.warning("%s", message)
    roots: bytes | None = None
    if ca_file:
        roots = _read("tls_ca_file", ca_file)
        cas = _certificates("tls_ca_file", ca_file, roots)
        issuers = {c.subject for c in cas}
        if chain[-1].issuer not in issuers and chain[-1].subject not in issuers:
            log.warning(
                "tls_cert_file: no certificate of tls_ca_file %r signed %r: other nodes that "
                "verify with that bundle will refuse this node",
                ca_file,
                cert_file,
            )
    host = advertised_host.strip("[]")
    if host and host not in ("0.0.0.0", "::") and not names_host(leaf, host):
        log.warning(
            "tls_cert_file: the certificate in %r does not name the advertised host %r in its "
            "subject alternative names: other nodes and clients dialing it will refuse it",
            cert_file,
            host,
        )
    return TlsConfig(cert_pem, key_pem, roots, client_auth)


def from_config(cfg: NodeConfig) -> TlsConfig | None:
    return load(
        cfg.tls_cert_file,
        cfg.tls_key_file,
        cfg.tls_ca_file,
        cfg.tls_client_auth,
        advertised_host=cfg.advertised.rpartition(":")[0],
    )
