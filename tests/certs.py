"""Throwaway certificates for the tests that speak TLS, made with ``cryptography`` when a test
needs them: no key material is checked in, and nothing in the repository expires.

It exists so that every suite (the SDK and fluxmqctl against a fake broker, the broker's own TLS
tests) builds its certificates one way instead of each carrying its own builder: EC P-256 keys,
SHA-256 signatures, valid from five minutes ago for a day (or, asked for, expired a day ago).

    ca = Authority("FluxMQ test CA")
    ca_file = ca.write(tmp / "ca.pem")
    node = ca.issue("node", sans=LOCAL_SANS, server=True, client=True).write(tmp, "node")
    grpc.ssl_channel_credentials(ca.cert_pem, *node.pair())
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOCAL_SANS = ("127.0.0.1", "localhost")  # the names of a node on this machine


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its key written to files (PEM; the key readable by its owner only)."""

    cert: Path
    key: Path

    def pair(self) -> tuple[bytes, bytes]:
        """(private key, certificate chain): the order grpc's SSL credentials take them in."""
        return self.key.read_bytes(), self.cert.read_bytes()


class Issued(NamedTuple):
    """A certificate and its private key (unencrypted PKCS#8), both PEM."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> CertFiles:
        """Writes ``<stem>.crt`` and ``<stem>.key`` (mode 0600) under ``directory``."""
        files = CertFiles(directory / f"{stem}.crt", directory / f"{stem}.key")
        files.cert.write_bytes(self.cert_pem)
        files.key.write_bytes(self.key_pem)
        files.key.chmod(0o600)
        return files


class Authority:
    """A self-signed CA whose common name is ``name``, held in memory. What it issues is signed
    by it; a second ``Authority`` is "another CA" for the tests where trust must fail."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(name)
        cert = (
            _builder(subject, subject, self._key.public_key(), expired=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self._subject = cert.subject
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)

    def write(self, path: Path) -> Path:
        """Writes the CA's certificate (PEM) to ``path``, for a trust-roots option; -> path."""
        path.write_bytes(self.cert_pem)
        return path

    def issue(
        self,
        common_name: str,
        *,
        sans: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
        expired: bool = False,
    ) -> Issued:
        """A certificate for ``common_name`` with a new key, signed by this CA.

        ``sans``: subject alternative names, IP addresses or DNS names (wildcards allowed);
        none, no such extension. ``server`` / ``client``: the extended key usages serverAuth /
        clientAuth; with neither there is no such extension (good for any use). ``expired``:
        valid from two days ago to one day ago."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(
            _name(common_name), self._subject, key.public_key(), expired=expired
        ).add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        usages = [
            usage
            for usage, wanted in (
                (ExtendedKeyUsageOID.SERVER_AUTH, server),
                (ExtendedKeyUsageOID.CLIENT_AUTH, client),
            )
            if wanted
        ]
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        if sans:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(s) for s in sans]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        return Issued(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _general_name(san: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(san))
    except ValueError:
        return x509.DNSName(san)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, *, expired: bool
) -> x509.CertificateBuilder:
    now, day = datetime.datetime.now(datetime.UTC), datetime.timedelta(days=1)
    if expired:
        not_before, not_after = now - 2 * day, now - day
    else:
        not_before, not_after = now - datetime.timedelta(minutes=5), now + day
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
