"""The environment that routes a process through wiretape and makes it trust wiretape's CA.

No single variable covers every client, so each gets its own: httpx and the httpx2-based
SDKs read SSL_CERT_FILE, requests reads REQUESTS_CA_BUNDLE, curl reads CURL_CA_BUNDLE (and
only the lowercase http_proxy for http), Node reads NODE_EXTRA_CA_CERTS. Each points at a
bundle of the system's CAs plus wiretape's, so traffic that bypasses the proxy still verifies.

Clients that ignore the proxy variables get a shim: PYTHONPATH carries a sitecustomize that
makes aiohttp read them, NODE_OPTIONS a preload that routes Node's fetch() and http/https
(Node 24 does it itself with NODE_USE_ENV_PROXY=1). Users set PYTHONPATH and NODE_OPTIONS
too, so wiretape's part goes before theirs and never replaces it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import orjson

from . import NODE_PRELOAD, PYTHON_SHIM_DIR

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
TRUST_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
SHIM_VARIABLES = ("PYTHONPATH", "NODE_OPTIONS", "NODE_USE_ENV_PROXY", "WIRETAPE_NODE_MODULES")
LOOPBACK = "localhost,127.0.0.1,::1"
# Variables holding a list the user may have set too, and what joins wiretape's part to theirs.
LIST_SEPARATORS = {"PYTHONPATH": os.pathsep, "NODE_OPTIONS": " "}
FORMATS = ("sh", "fish", "dotenv", "json")


def client_environment(
    proxy_url: str, reverse: str | None, home: Path, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables a client needs to reach wiretape at `proxy_url`, in either mode.

    Final values for a process whose environment is otherwise `base` (default: ours): a
    PYTHONPATH or NODE_OPTIONS already in `base` follows wiretape's part.
    """
    return combined(
        wiretape_variables(proxy_url, reverse, home), os.environ if base is None else base
    )


def wiretape_variables(proxy_url: str, reverse: str | None, home: Path) -> dict[str, str]:
    """wiretape's own values; for the LIST_SEPARATORS variables, only wiretape's part."""
    if reverse is not None:
        return base_url_environment(proxy_url, reverse)
    from wiretape.home import ca_bundle_path

    return proxy_environment(proxy_url, ca_bundle_path(home), home)


def proxy_environment(proxy_url: str, ca_bundle: Path, home: Path) -> dict[str, str]:
    """Variables for proxy mode: every HTTP(S) request goes through `proxy_url`."""
    from .installs import node_modules_dir

    env = dict.fromkeys(PROXY_VARIABLES, proxy_url)
    env.update(dict.fromkeys(TRUST_VARIABLES, str(ca_bundle)))
    env["WIRETAPE_PROXY"] = proxy_url
    env["PYTHONPATH"] = str(PYTHON_SHIM_DIR)
    env["NODE_OPTIONS"] = node_require_option(NODE_PRELOAD)
    env["NODE_USE_ENV_PROXY"] = "1"
    env["WIRETAPE_NODE_MODULES"] = str(node_modules_dir(home))
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


def combined(variables: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
    """`variables` as final values: wiretape's part of a list variable, then `base`'s value.

    A list that already holds wiretape's part (a shell that ran `wiretape env` before) is
    kept as it is, so the part is never doubled.
    """
    result = dict(variables)
    for name, separator in LIST_SEPARATORS.items():
        ours, theirs = variables.get(name), base.get(name)
        if ours and theirs:
            present = ours in theirs.split(separator) if separator != " " else ours in theirs
            result[name] = theirs if present else ours + separator + theirs
    return result


def node_require_option(preload: Path) -> str:
    """`--require PATH` as NODE_OPTIONS takes it (double quotes when the path has spaces)."""
    path = str(preload)
    if any(c.isspace() or c in "\"'\\" for c in path):
        path = '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "--require " + path


def format_environment(
    variables: Mapping[str, str], fmt: str, base: Mapping[str, str] | None = None
) -> str:
    """`variables` (from `wiretape_variables`) for a shell to eval or a program to read.

    sh and fish join a list variable to the value it has when the shell evaluates the line.
    dotenv and json cannot say "before the current value": they give final values, joined
    to the values in `base` (default: our own environment) at the time of printing.
    """
    if fmt in ("json", "dotenv"):
        final = combined(variables, os.environ if base is None else base)
        if fmt == "json":
            return orjson.dumps(final, option=orjson.OPT_INDENT_2).decode() + "\n"
        return "".join(f"{name}={value}\n" for name, value in final.items())
    lines = []
    for name, value in variables.items():
        separator = LIST_SEPARATORS.get(name)
        if fmt == "sh" and separator:
            # Expands at eval time: wiretape's part, then the shell's value if it has one.
            lines.append(f'export {name}={shlex.quote(value)}"${{{name}:+{separator}${name}}}"')
        elif fmt == "sh":
            lines.append(f"export {name}={shlex.quote(value)}")
        elif fmt == "fish" and name == "PYTHONPATH":
            # fish keeps variables ending in PATH as lists and exports them joined with ':'.
            lines.append(f"set -gx {name} {shlex.quote(value)} ${name}")
        elif fmt == "fish" and separator:
            lines.append(f"set -gx {name} (string join ' ' -- {shlex.quote(value)} ${name})")
        else:
            lines.append(f"set -gx {name} {shlex.quote(value)}")
    return "\n".join(lines) + "\n"
