"""wiretape's own directory: the CA that clients trust, the CA bundle, the redaction key.

`$WIRETAPE_HOME`, default `~/.wiretape`, created mode 0700 on first use. The CA files keep
mitmproxy's names because the recorder's embedded mitmproxy reads them from there.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

CA_BASENAME = "mitmproxy"  # mitmproxy's confdir looks for mitmproxy-ca.pem
CA_KEY_SIZE = 2048


def wiretape_home() -> Path:
    home = Path(os.environ.get("WIRETAPE_HOME") or Path.home() / ".wiretape").expanduser()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def ca_cert_path(home: Path) -> Path:
    """The CA certificate clients must trust; created (with its 0600 key) on first use."""
    cert = home / f"{CA_BASENAME}-ca-cert.pem"
    if not (home / f"{CA_BASENAME}-ca.pem").exists() or not cert.exists():
        from mitmproxy.certs import CertStore  # 0.2 s to import: only when a CA is missing

        CertStore.from_store(home, CA_BASENAME, CA_KEY_SIZE)
    return cert


def ca_bundle_path(home: Path) -> Path:
    """The system's CAs plus wiretape's, so a client given this bundle trusts both.

    Rewritten whenever it is older than either source, so a renewed CA or an updated system
    store reaches clients.
    """
    cert = ca_cert_path(home)
    bundle = home / "ca-bundle.pem"
    system = system_ca_file()
    sources = [cert] + ([system] if system else [])
    if not bundle.exists() or any(s.stat().st_mtime > bundle.stat().st_mtime for s in sources):
        parts = [cert.read_bytes()] + ([system.read_bytes()] if system else [])
        _write_atomically(bundle, b"\n".join(parts))
    return bundle


def system_ca_file() -> Path | None:
    """The system's CA bundle file, falling back to certifi's when the system has none."""
    paths = ssl.get_default_verify_paths()
    # Not paths.cafile: that follows SSL_CERT_FILE, which may point at our own bundle.
    for candidate in (os.environ.get("WIRETAPE_SYSTEM_CA"), paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    try:
        import certifi
    except ImportError:
        return None
    return Path(certifi.where())


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_bytes(data)
    os.replace(temporary, path)
