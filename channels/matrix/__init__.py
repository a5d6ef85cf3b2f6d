"""Matrix channel adapter (matrix-nio 0.26, client-server sync long polling)."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import MatrixSettings

if TYPE_CHECKING:
    from .channel import MatrixChannel

__all__ = ["MatrixChannel", "MatrixSettings"]
__getattr__ = lazy_exports(__name__, {"MatrixChannel": ".channel"})
