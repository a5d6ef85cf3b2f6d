"""Chat platform adapters: one package per platform (docs/channels.md), one contract (base.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a platform package: ``exports`` maps a name to the submodule
    that defines it, imported on first use. The settings model is imported eagerly (config needs
    it); the adapter, and with it the SDK, only when a channel is built, so a platform that is off
    costs neither import time nor memory."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name], package), name)

    return __getattr__
