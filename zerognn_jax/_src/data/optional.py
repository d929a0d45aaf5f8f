"""Optional dependencies (jraph, networkx, PyTorch and PyG), imported when a conversion
that needs one is called; missing, the error says what to install."""

from __future__ import annotations

import importlib
import types

INSTALL = {"jraph": "pip install 'zerognn-jax[jraph]'",
           "networkx": "pip install 'zerognn-jax[networkx]'",
           "torch": "pip install torch", "torch_geometric": "pip install torch_geometric"}


def need(module: str, what: str) -> types.ModuleType:
    """`module` imported; ImportError naming `what` needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        raise ImportError(f"{what} needs {top}, which is not installed here: "
                          f"{INSTALL[top]}") from err
