"""The environment that routes a process through wiretape and makes it trust wiretape's CA.

No single variable covers every client, so each gets its own: httpx and the httpx2-based
SDKs read SSL_CERT_FILE, requests reads REQUESTS_CA_BUNDLE, curl reads CURL_CA_BUNDLE (and
only the lowercase http_proxy for http), Node reads NODE_EXTRA_CA_CERTS. Each points at a
bundle of the system's CAs plus wiretape's, so traffic that bypasses the proxy still verifies.
"""

from __future__ import annotations

from pathlib import Path

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
TRUST_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
LOOPBACK = "localhost,127.0.0.1,::1"


def client_environment(proxy_url: str, reverse: str | None, home: Path) -> dict[str, str]:
    """The variables a client needs to reach wiretape at `proxy_url`, in either mode."""
    if reverse is not None:
        return base_url_environment(proxy_url, reverse)
    from wiretape.home import ca_bundle_path

    return proxy_environment(proxy_url, ca_bundle_path(home))


def proxy_environment(proxy_url: str, ca_bundle: Path) -> dict[str, str]:
    """Variables for proxy mode: every HTTP(S) request goes through `proxy_url`."""
    env = dict.fromkeys(PROXY_VARIABLES, proxy_url)
    env.update(dict.fromkeys(TRUST_VARIABLES, str(ca_bundle)))
    env["WIRETAPE_PROXY"] = proxy_url
    return env


def base_url_environment(base_url: str, upstream: str) -> dict[str, str]:
    """Variables for base-URL mode: the client talks plain HTTP to wiretape on loopback.

    NO_PROXY keeps a client that also has a proxy configured from sending its loopback
    traffic into that proxy. Well-known SDK variables are set when the upstream is theirs.
    """
    env = {"NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK, "WIRETAPE_BASE_URL": base_url}
    for host, variables in SDK_BASE_URLS.items():
        if upstream.rstrip("/").endswith("://" + host):
            env.update({name: base_url + suffix for name, suffix in variables})
    return env


# The base-URL variables the official SDKs read, and the path each expects after the host.
SDK_BASE_URLS = {
    "api.openai.com": [("OPENAI_BASE_URL", "/v1")],
    "api.anthropic.com": [("ANTHROPIC_BASE_URL", "")],
}
