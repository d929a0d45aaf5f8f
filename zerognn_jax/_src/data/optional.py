"""Optional dependencies (jraph, networkx, PyTorch and PyG), imported when a conversion
that needs one is called; missing, the error says what to install."""

from __future__ import annotations

import importlib
import types

PYG = "pip install 'zerognn-jax[pyg]' (torch and torch_geometric)"
INSTALL = {"jraph": "pip install 'zerognn-jax[jraph]'",
           "networkx": "pip install 'zerognn-jax[networkx]'",
           "torch": PYG, "torch_geometric": PYG}


def need(module: str, what: str) -> types.ModuleType:
    """`module` imported; ImportError naming `what` needs it and how to install it."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name not in (top, module):  # installed, and broken: its own error
            raise
        raise ImportError(f"{what} needs {top}, which is not installed here: "
                          f"{INSTALL[top]}") from err
