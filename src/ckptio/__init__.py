"""ckptio: keep checkpoint I/O bursts off the training critical path."""

from __future__ import annotations

from ckptio import errors
from ckptio.config import CheckpointerConfig

__version__ = "0.1.0"

__all__ = ["CheckpointerConfig", "__version__", "errors"]
