"""Leaf certificates issued from wiretape's CA, as server TLS contexts, one per host.

The replay server terminates TLS for every `CONNECT` host itself, so clients that trust
wiretape's CA (the same one the recorder's mitmproxy uses) accept it. Only `cryptography` is
used, and only once the first certificate is needed: replay must start fast, and importing it
costs about 0.13 s (mitmproxy's certificate store costs more).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import tempfile
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .home import CA_BASENAME, ca_cert_path

__all__ = ["LeafIssuer"]

# Clients reject certificates from the future: a little backdating absorbs clock skew.
BACKDATE = timedelta(days=2)
# Apple's clients cap server certificates at 397 days.
LIFETIME = timedelta(days=365)
# X.509 limits a common name to 64 characters; the SAN carries the full name anyway.
MAX_COMMON_NAME = 64


class LeafIssuer:
    """Hands out a server `SSLContext` for a host, with a leaf certificate for that name.

    One EC P-256 key serves every leaf (cheap to sign for, fast to handshake with); contexts
    are cached per host. The CA is created in `home` if it does not exist yet.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._ca: _Authority | None = None
        self._loading = threading.Lock()

    def context_for(self, host: str) -> ssl.SSLContext:
        context = self._contexts.get(host)
        if context is None:
            context = self._contexts[host] = self._new_context(host)
        return context

    def prepare(self) -> None:
        """Load the CA and the leaf key now (0.2 s), e.g. from a thread while serving starts,
        so the first tunnel does not wait for it."""
        with self._loading:
            if self._ca is None:
                self._ca = _Authority.load(self.home)

    def _new_context(self, host: str) -> ssl.SSLContext:
        self.prepare()
        assert self._ca is not None
        chain = self._ca.issue(host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # Replay speaks HTTP/1.1 only: offering h2 would make h2-capable clients choose it.
        context.set_alpn_protocols(["http/1.1"])
        _load_chain(context, chain)
        return context


class _Authority:
    """wiretape's CA key and certificate, and the one key its leaves share."""

    def __init__(self, key: Any, cert: Any, leaf_key: Any, leaf_key_pem: bytes) -> None:
        self.key = key
        self.cert = cert
        self.leaf_key = leaf_key
        self.leaf_key_pem = leaf_key_pem

    @classmethod
    def load(cls, home: Path) -> _Authority:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        ca_cert_path(home)  # creates the CA on first use
        pem = (home / f"{CA_BASENAME}-ca.pem").read_bytes()  # the key, then the certificate
        key = serialization.load_pem_private_key(pem, password=None)
        cert = x509.load_pem_x509_certificate(pem)
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        leaf_key_pem = leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cls(key, cert, leaf_key, leaf_key_pem)

    def issue(self, host: str) -> bytes:
        """The PEM of a leaf certificate for `host` (a DNS name or an IP address), then its key."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        try:
            name: Any = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            name = x509.DNSName(host)
        now = datetime.now(UTC)
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "wiretape")]
        if len(host) <= MAX_COMMON_NAME:
            subject.append(x509.NameAttribute(NameOID.COMMON_NAME, host))
        leaf_public = self.leaf_key.public_key()
        # Python 3.13 verifies strictly (VERIFY_X509_STRICT): key usage, both key ids and a
        # critical basic-constraints extension must all be present.
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.cert.subject)
            .public_key(leaf_public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(min(now + LIFETIME, self.cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([name]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_server_key_usage(x509), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_public), critical=False)
            .add_extension(self._authority_key_id(x509), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM) + self.leaf_key_pem

    def _authority_key_id(self, x509: Any) -> Any:
        try:
            ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        except x509.ExtensionNotFound:
            return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key())
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value)


def _server_key_usage(x509: Any) -> Any:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _load_chain(context: ssl.SSLContext, chain: bytes) -> None:
    # The ssl module loads certificates only from files: a private one, gone once loaded.
    descriptor, path = tempfile.mkstemp(prefix="wiretape-leaf-", suffix=".pem")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(chain)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)
