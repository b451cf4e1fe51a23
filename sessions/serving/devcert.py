"""A local TLS certificate for the demo and the tests (``cryptography``), like mkcert.

:func:`make_local_certificate` writes a small certificate authority of its own and a
server certificate it signed for ``localhost``, ``127.0.0.1`` and ``::1``: trust the CA
(``ca.pem``) once — in the browser, ``curl --cacert``, or the system store — and the
server certificate is accepted. Browsers speak HTTP/2 only over TLS, so this is how the
demo gets HTTP/2 on this machine. Never for a public server.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LocalCertificate", "make_local_certificate"]

HOSTS: Final = ("localhost", "127.0.0.1", "::1")
VALID_DAYS: Final = 30


@dataclass(frozen=True, slots=True)
class LocalCertificate:
    """The files written: ``ca`` (trust this), ``cert`` (chain) and ``key`` (PKCS#8)."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "qwenweb local development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_local_certificate(directory: Path, hosts: tuple[str, ...] = HOSTS) -> LocalCertificate:
    """Write ``ca.pem``, ``cert.pem`` and ``key.pem`` (mode 0600) into ``directory``.

    The server certificate covers ``hosts`` (names and IP addresses), is valid for
    :data:`VALID_DAYS` days and is signed by the new CA (P-256 keys, SHA-256).

    Raises ``OSError`` when the files cannot be written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_after = now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("qwenweb local CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = LocalCertificate(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    pem = serialization.Encoding.PEM
    paths.ca.write_bytes(ca.public_bytes(pem))
    paths.cert.write_bytes(cert.public_bytes(pem) + ca.public_bytes(pem))
    paths.key.touch(mode=0o600)
    paths.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths
