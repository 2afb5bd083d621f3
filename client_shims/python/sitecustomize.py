"""wiretape's Python shim: clients that ignore the proxy variables by default use them.

`wiretape record/replay -- COMMAND` and `wiretape env` put this file's directory first on
PYTHONPATH, so every Python 3.8+ started from there imports it at start-up. It runs inside the
user's program: it imports nothing of wiretape's, patches a library only when the program
imports that library itself, and then runs the sitecustomize that would have run without it.

aiohttp: `ClientSession(trust_env=...)` defaults to True instead of False, so sessions read
HTTPS_PROXY, HTTP_PROXY and NO_PROXY (and .netrc) as requests and httpx do. An explicit
`trust_env=False` is left alone.
"""

import contextlib
import os
import sys

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
SHIM_DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def patch_aiohttp_client(module):
    """Make `trust_env=True` the default of aiohttp's ClientSession."""
    session = getattr(module, "ClientSession", None)
    original = getattr(session, "__init__", None)
    if original is None or getattr(original, "__wiretape__", False):
        return

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("trust_env", True)
        original(self, *args, **kwargs)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(__init__, name, getattr(original, name))
    __init__.__wrapped__ = original
    __init__.__wiretape__ = True
    session.__init__ = __init__


# Module name -> what to do to it once it has been executed.
PATCHES = {"aiohttp.client": patch_aiohttp_client}


class WiretapeImportHook:
    """Patches a module right after it is first imported; never imports anything itself."""

    def __init__(self, patches):
        self.patches = dict(patches)

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        execute = getattr(loader, "exec_module", None)
        if execute is None:
            return spec

        def exec_module(module):
            execute(module)
            self.patches.pop(name, None)
            try:
                patch(module)
            except Exception as exc:  # a newer library: leave it as it is, and say so
                sys.stderr.write(f"wiretape: could not patch {name}: {exc!r}\n")

        # On the loader instance (one per module), so the module keeps its own loader.
        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_module
        return spec


def install():
    if not any(os.environ.get(name) for name in PROXY_VARIABLES):
        return
    pending = {}
    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            pending[name] = patch
    if pending and not any(type(f).__name__ == "WiretapeImportHook" for f in sys.meta_path):
        sys.meta_path.insert(0, WiretapeImportHook(pending))


def chain_to_next_sitecustomize():
    """Run the sitecustomize later on sys.path, the one Python would have run without us.

    It replaces this module in sys.modules, as if it had been imported directly.
    """
    import importlib.machinery
    import importlib.util

    here = os.path.normcase(os.path.realpath(SHIM_DIRECTORY))
    rest = [
        entry
        for entry in sys.path
        if os.path.normcase(os.path.realpath(entry or os.curdir)) != here
    ]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    install()
except Exception as exc:  # never stop the user's program from starting
    sys.stderr.write(f"wiretape: the Python shim failed: {exc!r}\n")
chain_to_next_sitecustomize()
