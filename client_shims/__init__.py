"""What makes a client use the proxy and trust its CA: the environment builder and the shims.

The shims run inside the user's processes and depend on nothing of wiretape's: a
`sitecustomize` for any Python 3.8+ (in `PYTHON_SHIM_DIR`, put on PYTHONPATH) and a preload
for Node 18+ (`NODE_PRELOAD`, loaded with NODE_OPTIONS=--require).
"""

from pathlib import Path

__all__ = ["NODE_PRELOAD", "PYTHON_SHIM_DIR"]

PYTHON_SHIM_DIR = Path(__file__).resolve().parent / "python"
NODE_PRELOAD = Path(__file__).resolve().parent / "node" / "preload.cjs"
