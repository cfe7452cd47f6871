"""The point-to-point side of a restore's exchange: ranges sent to and received from other ranks, and what happens
when one of those ranks is gone.

gloo reports a dead peer as a ``RuntimeError`` from the send or receive that used its connection ("Connection closed
by peer", "Connection reset by peer"). Here that becomes :class:`~ckptio.errors.PeerLostError` naming the rank and
the phase, recorded once per rank; from then on nothing more is sent to or expected from that rank, so the walk
still finishes for the live ranks that wait for this one, and then raises it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ckptio.engine.side_group import recv_async, send_async
from ckptio.errors import PeerLostError


@dataclass(frozen=True, slots=True)
class Posted:
    """A send or receive in flight with ``peer`` (``work`` None: nothing was posted, the peer is gone)."""

    peer: int
    work: Any


class PeerLinks:
    """Sends and receives of one rank's transfer on ``group``; ``lost`` holds the ranks found gone."""

    def __init__(self, group: Any, *, step: int, root: str) -> None:
        self.group, self.step, self.root = group, step, root
        self.lost: dict[int, PeerLostError] = {}

    def lose(self, peer: int, exc: BaseException) -> None:
        if peer not in self.lost:
            self.lost[peer] = PeerLostError(f"rank {peer} was lost during the restore's exchange of ranges: {exc}",
                                            root=self.root, step=self.step, rank=peer, phase="exchange")

    def _post(self, post: Any, view: memoryview, peer: int, tag: int) -> Posted:
        if peer in self.lost:
            return Posted(peer, None)
        try:
            return Posted(peer, post(torch.frombuffer(view, dtype=torch.uint8), self.group, peer, tag))
        except RuntimeError as exc:
            self.lose(peer, exc)
            return Posted(peer, None)

    def send(self, view: memoryview, peer: int, tag: int) -> Posted:
        """Start sending ``view`` to ``peer`` (nothing when it is gone)."""
        return self._post(send_async, view, peer, tag)

    def recv(self, view: memoryview, peer: int, tag: int) -> Posted:
        """Post the receive of ``view`` from ``peer`` (nothing when it is gone)."""
        return self._post(recv_async, view, peer, tag)

    def wait(self, posted: Posted) -> bool:
        """Wait for ``posted``; False when its peer is (or turns out to be) gone. Once one operation on a pair has
        reported the peer gone, gloo leaves the others on that pair pending for ever: they are not waited for."""
        if posted.work is None or posted.peer in self.lost:
            return False
        try:
            posted.work.wait()
        except RuntimeError as exc:
            self.lose(posted.peer, exc)
            return False
        return True

    def done(self, posted: Posted) -> bool:
        """Whether ``posted`` finished (or failed, or its peer is gone), without waiting."""
        return posted.work is None or posted.peer in self.lost or bool(posted.work.is_completed())
