"""What `wiretape shims install node` installs: undici, for the Node preload's fetch().

Node's built-in fetch() has no public way to use a proxy before Node 24, but it reads the
dispatcher that undici's `setGlobalDispatcher` sets. The preload takes undici from
`$WIRETAPE_HOME/node/node_modules`, installed from the npm registry by this step, never from
a copy in wiretape. undici 6 is the newest major that still runs on Node 18.
"""

from __future__ import annotations

import json
from pathlib import Path

UNDICI = "undici@6"
INSTALL_COMMAND = "wiretape shims install node"


def node_modules_dir(home: Path) -> Path:
    return home / "node" / "node_modules"


def npm_install_command(npm: str, home: Path) -> list[str]:
    return [
        npm,
        "install",
        "--prefix",
        str(home / "node"),
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        UNDICI,
    ]


def installed_undici(home: Path) -> str | None:
    """The version of the undici the preload would load, or None if there is none."""
    manifest = node_modules_dir(home) / "undici" / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def npm_environment(base: dict[str, str]) -> dict[str, str]:
    """`base` without what routes it through wiretape: npm's own traffic is not the agent's."""
    ours = base.get("WIRETAPE_PROXY")
    env = {
        name: value
        for name, value in base.items()
        if not (ours and value == ours and name.lower() in ("https_proxy", "http_proxy"))
    }
    if "NODE_OPTIONS" in env:
        from . import NODE_PRELOAD
        from .environment import node_require_option

        preload = node_require_option(NODE_PRELOAD)
        env["NODE_OPTIONS"] = env["NODE_OPTIONS"].replace(preload, "").strip()
    return env
