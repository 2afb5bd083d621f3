"""Shared fixtures: a TLS fake upstream, an isolated WIRETAPE_HOME, and ways to run clients
directly and through the real `wiretape` command."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from wiretape.fake_upstream import FakeUpstream

WIRETAPE = str(Path(sys.executable).with_name("wiretape"))
PYCLIENT = str(Path(__file__).parent / "clients" / "pyclient.py")
COMMAND_TIMEOUT = 120
# The scenarios of tests/clients/pyclient.py, one per client library and API shape.
SCENARIOS = [
    "openai-chat",
    "openai-stream",
    "openai-tools",
    "openai-async-stream",
    "openai-responses",
    "anthropic",
    "httpx-sse",
    "requests-json",
]

# Variables from the machine that would route or trust differently than a test intends.
_SCRUBBED = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "OPENAI_BASE_URL",
    "ANTHROPIC_BASE_URL",
    "WIRETAPE_HOME",
)


@dataclass(frozen=True)
class Secrets:
    """Realistic keys the tests plant and then look for on disk."""

    openai: str
    anthropic: str
    github: str

    def all(self) -> list[str]:
        return [self.openai, self.anthropic, self.github]


@pytest.fixture(scope="session")
def planted() -> Secrets:
    return Secrets(
        openai="sk-proj-" + secrets.token_urlsafe(36),
        anthropic="sk-ant-api03-" + secrets.token_urlsafe(60),
        github="ghp_" + secrets.token_hex(18),
    )


@pytest.fixture(scope="session")
def upstream():
    with FakeUpstream(tls=True) as server:
        yield server


@pytest.fixture(scope="session")
def wiretape_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wiretape-home")


def base_env(home: Path, planted: Secrets) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.upper() not in _SCRUBBED}
    env["WIRETAPE_HOME"] = str(home)
    env["OPENAI_API_KEY"] = planted.openai
    env["ANTHROPIC_API_KEY"] = planted.anthropic
    env["PLANTED_SECRET"] = planted.github
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def env(wiretape_home, planted) -> dict[str, str]:
    return base_env(wiretape_home, planted)


def direct_env(env: dict[str, str], upstream: FakeUpstream) -> dict[str, str]:
    """A client environment that trusts the fake upstream directly, no wiretape."""
    trusted = dict(env)
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        trusted[name] = upstream.ca_path
    return trusted


def run(args: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, **kwargs
    )


def wiretape(*args: str, env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return run([WIRETAPE, *args], env, **kwargs)


def pyclient(scenario: str, url: str) -> list[str]:
    return [sys.executable, PYCLIENT, scenario, url]
