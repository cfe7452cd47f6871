"""What one partner server (and each of its clients) may spend: connections, time, memory.

Every limit turns a peer's misbehaviour — connecting and saying nothing, reading nothing, trickling bytes — into
a closed connection after a bounded time, never into a stopped server or memory that grows per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ckptio.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class PartnerLimits:
    """Bounds of the partner channel (both sides use the same deadlines)."""

    max_connections: int = 64
    """Connections served at once, handshakes included. One more is accepted and closed at once, so a flood never
    queues behind the server's threads; the job's own writers open one connection per copy and hold it briefly."""
    handshake_s: float = 5.0
    """An unauthenticated connection holds a server thread for at most this long."""
    idle_s: float = 30.0
    """No progress (no byte received or sent, no next request) for this long closes the connection."""
    min_rate: float = float(8 << 20)
    """Bytes per second a transfer must average after a grace of ``idle_s``: a file of ``size`` bytes must cross
    within ``idle_s + size / min_rate`` seconds, so a peer that trickles one byte per ``idle_s`` still ends."""

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ConfigError(f"partner max_connections must be >= 1, got {self.max_connections}")
        for name in ("handshake_s", "idle_s", "min_rate"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"partner {name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def for_timeout(cls, timeout_s: float) -> PartnerLimits:
        """The limits a job with ``partner_timeout_s=timeout_s`` uses (its idle deadline; handshakes at most
        5 s, less when the timeout is shorter)."""
        return cls(idle_s=timeout_s, handshake_s=min(5.0, timeout_s))

    def transfer_deadline(self, size: int) -> float:
        """The monotonic time by which a transfer of ``size`` bytes starting now must be complete."""
        return time.monotonic() + self.idle_s + size / self.min_rate

    @property
    def stale_s(self) -> float:
        """A temporary file nobody wrote to for this long is abandoned: a live transfer makes progress at least
        every ``idle_s`` or is dropped (and deletes its temp file) by then."""
        return 2 * self.idle_s + self.handshake_s
