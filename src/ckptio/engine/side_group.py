"""The only collectives ckptio runs, all on a dedicated gloo side group and all from the training thread.

Planning goes through one coordinator: rank 0 gathers every rank's local plan and sends each rank back only its
own final plan (what DCP does), so a re-plan moves O(N) bytes across the job, not the O(N²) of an all-gather.

The steady path runs no collective: every rank derives the same save id from a run nonce agreed once at
construction and the save's ordinal (:class:`SaveIds`), and commit-or-drop is agreed through the store (drop
markers, see ``engine.writer.step_committer``). Only a *planning* save — the first one, and one whose state structure
changed — is agreed collectively: a bounded barrier (a structure change on some ranks only is a named error, never a
hang), then one tiny ``all_reduce`` tells every rank whether all ranks have a free staging slot and whether any rank has
an error to report, so every rank takes the same decision before the collective planning. Without
``torch.distributed`` the same code runs with world size 1 and no communication.

Restore exchanges byte ranges between ranks (:mod:`ckptio.engine.restore.transfer`): point-to-point sends and receives
posted here, on the group ``dcp.load`` runs on (ckptio's side group), every rank in the read plan's global order. After
a node loss, the files pushed back to it (:mod:`ckptio.engine.restore.early_push`) go on a gloo group the restore makes
for them and destroys after, so that its collectives never wait behind those bytes.

Never call these from a background thread: collectives on a group shared with the training loop deadlock.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ckptio.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Agreement:
    """The outcome of one save agreement, identical on every rank."""

    all_free: bool
    any_changed: bool
    any_error: bool


class SaveIds:
    """Save ids every rank derives alike without communicating: a run nonce agreed once, and the save's ordinal
    (every rank calls ``save`` together, so ordinals match). A fresh nonce per Checkpointer keeps a restarted job's
    attempts apart from the last run's."""

    def __init__(self, nonce: int) -> None:
        self.nonce, self.count = nonce, 0

    def next(self) -> int:
        self.count += 1
        digest = hashlib.blake2b(f"{self.nonce}:{self.count}".encode(), digest_size=8).digest()
        return (int.from_bytes(digest, "big") & ((1 << 52) - 1)) or 1  # 52 bits: exact in JSON readers' doubles


class SideGroup:
    """Rank, world size and a private gloo group (None when running as a single process)."""

    def __init__(self, process_group: Any = None) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        if not self.distributed:
            if process_group is not None:
                raise ConfigError("process_group given but torch.distributed is not initialized")
            self.rank, self.world_size, self.group, self._owns_group = 0, 1, None, False
            return
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # Every rank constructs the Checkpointer together, so new_group (a collective itself) is safe here.
        # A private gloo group keeps ckptio's CPU collectives off the (often NCCL) training group.
        self.group = dist.new_group(backend="gloo") if process_group is None else process_group
        self._owns_group = process_group is None

    def agree(self, *, free: bool, changed: bool, error: bool) -> Agreement:
        if not self.distributed:
            return Agreement(all_free=free, any_changed=changed, any_error=error)
        vec = torch.tensor([int(free), int(changed), int(error)], dtype=torch.int64)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM, group=self.group)
        free_n, changed_n, error_n = (int(x) for x in vec.tolist())
        return Agreement(all_free=free_n == self.world_size, any_changed=changed_n > 0, any_error=error_n > 0)

    def gate(self, timeout_s: float, what: str) -> None:
        """A barrier that gives up after ``timeout_s``: every rank must reach ``what`` together. ConfigError when
        some rank does not come (its state structure did not change at this save, or it raised before it)."""
        if not self.distributed or dist.get_backend(self.group) != "gloo":
            return  # monitored_barrier is gloo's; another backend's plain collectives stay unbounded
        try:
            dist.monitored_barrier(group=self.group, timeout=datetime.timedelta(seconds=timeout_s),
                                   wait_all_ranks=True)
        except RuntimeError as exc:
            raise ConfigError(f"not every rank reached {what} within {timeout_s:.0f} s: a state structure change "
                              f"must happen on every rank at the same step ({exc})", rank=self.rank) from exc

    def barrier_within(self, timeout_s: float) -> None:
        """Every rank meets here, or RuntimeError after ``timeout_s`` (gloo's monitored barrier: rank 0's error
        names the ranks that did not come; the others' say only that rank 0 did not answer). Another backend's
        barrier stays unbounded."""
        if not self.distributed:
            return
        if dist.get_backend(self.group) != "gloo":
            dist.barrier(group=self.group)
            return
        dist.monitored_barrier(group=self.group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)

    def destroy(self) -> None:
        """Undo the gloo group this created (a failed construction only: a live group stays until exit)."""
        if self.group is not None and self._owns_group:
            dist.destroy_process_group(self.group)

    def gather_to_rank0(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (in rank order), None elsewhere: N objects in, not N² as an all-gather."""
        if not self.distributed:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=self._rank0(), group=self.group)
        return out

    def scatter_from_rank0(self, objs: list[Any] | None) -> Any:
        """Rank r receives ``objs[r]`` from rank 0 (``objs`` is read on rank 0 only): each rank gets its own."""
        if not self.distributed:
            assert objs is not None
            return objs[0]
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs if self.rank == 0 else None, src=self._rank0(), group=self.group)
        return box[0]

    def _rank0(self) -> int:
        # The side group's rank 0 as a global rank (they differ when a caller passes its own process_group).
        return dist.get_global_rank(self.group, 0) if self.group is not None else 0

    def broadcast_from_rank0(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self._rank0(), group=self.group)
        return box[0]

    def any_true(self, flag: bool) -> bool:
        if not self.distributed:
            return flag
        t = torch.tensor([int(flag)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return int(t.item()) > 0

    def any_of(self, flags: list[bool]) -> list[bool]:
        """For each of ``flags``, whether any rank set it: one all-reduce, however many flags."""
        work, t = self.any_true_async(flags)
        if work is not None:
            work.wait()
        return [int(n) > 0 for n in t.tolist()]

    def any_true_async(self, flags: list[bool]) -> tuple[Any, torch.Tensor]:
        """Start an all-reduce of ``flags`` (how many ranks raised each) without waiting: (work or None, tensor)."""
        t = torch.tensor([int(f) for f in flags], dtype=torch.int64)
        if not self.distributed:
            return None, t
        return dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group, async_op=True), t


# ---- restore's exchange (on whatever group dcp.load runs on: ckptio's side group, or the caller's) -------------
def any_true_in(group: Any, flag: bool) -> bool:
    """Whether ``flag`` is set on any rank of ``group`` (every rank calls)."""
    t = torch.tensor([int(flag)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return int(t.item()) > 0


def send_async(tensor: torch.Tensor, group: Any, peer: int, tag: int) -> Any:
    """Start sending ``tensor`` to group rank ``peer``; the returned work completes once the peer took it."""
    return dist.isend(tensor, group=group, group_dst=peer, tag=tag)


def recv_async(tensor: torch.Tensor, group: Any, peer: int, tag: int) -> Any:
    """Post the receive of ``tensor`` from group rank ``peer``; wait on the returned work."""
    return dist.irecv(tensor, group=group, group_src=peer, tag=tag)


def moves_cpu_tensors(group: Any, world: int) -> bool:
    """True when ``group`` spans ``world`` ranks and its backend moves CPU tensors (gloo, alone or mixed)."""
    return group is not None and dist.get_world_size(group) == world and "gloo" in str(dist.get_backend(group))
