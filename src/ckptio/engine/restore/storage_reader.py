"""The restore's DCP StorageReader: ranged reads straight into the targets, every byte read once across ranks.

``torch.distributed.checkpoint.load(sd, storage_reader=CkptioStorageReader(storage, step))`` reads a ckptio
checkpoint from POSIX or S3 at any world size. How it reads:

1. ``read_metadata``: ``.metadata``, checked against the manifest, unpickled with an allowlist.
2. ``prepare_global_plan`` (the coordinator, once): reads the rank indexes for the items' block checksums and
   where their raw bytes start, derives the byte ranges every rank needs from DCP's plans, and assigns each range
   one reader (:mod:`ckptio.engine.restore.read_plan`); each rank's plan carries its share.
3. ``read_data`` (every rank): reads its ranges from the store into the targets' memory (or bounce buffers),
   verifies each checksum block as it lands, sends ranges to the ranks that need them too and receives its other
   ranges from their readers (:mod:`ckptio.engine.restore.transfer`, over the reader's process group when it moves CPU
   tensors: gloo), then loads what needs loading (:mod:`ckptio.engine.restore.destinations`).

Files written before block checksums (or whose rank index is missing or disagrees with the manifest) are read
whole and checked with the file's crc32c, as before. The reader runs no code from the store: ``.metadata`` and
objects are unpickled with allowlists (``trust_pickles=True`` is the explicit opt-in; docs/security.md), tensors
come from raw bytes or ``torch.load(weights_only=True)``, and every read stays inside the files the manifest lists.

Pass the process group ``dcp.load`` runs on as ``process_group`` (None: the default group, as DCP's own default).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ckptio.engine.restore.context import ReadOptions, RestoreContext
from ckptio.engine.restore.destinations import Dest, DestHooks, StreamDest, make_dest
from ckptio.engine.restore.read_plan import (
    CHUNK_BYTES,
    ChunkShape,
    Place,
    RankReads,
    StoreLayout,
    Task,
    need_range,
    plan_reads,
)
from ckptio.engine.restore.step_layout import (
    build_layout,
    build_plain_layout,
    check_real_sizes,
    chunk_shapes,
    read_item_records,
)
from ckptio.engine.restore.stored_blob import BlobOpener
from ckptio.engine.restore.transfer import Source, Transfer, TransferSpec
from ckptio.engine.side_group import any_true_in, moves_cpu_tensors
from ckptio.errors import CheckpointNotFoundError, CkptError, CorruptCheckpointError
from ckptio.format import (
    MANIFEST,
    METADATA,
    FileRecord,
    Manifest,
    check_file,
    index_key,
    read_manifest,
    record_key,
    step_dir,
)
from ckptio.format.crosscheck import metadata_problems
from ckptio.format.plain_dcp import is_plain_dcp, plain_manifest
from ckptio.format.safe_pickle import load_metadata, load_object
from ckptio.storage.base import ReadStore, Storage, join_key


class ReadTally:
    """What a rank's last ``read_data`` read, per source: the bytes, and the files served from the local tier."""

    def __init__(self) -> None:
        self.local_hits: list[str] = []
        """Files served (wholly or partly) from the local tier (for reports and tests)."""
        self.bytes_by_source: dict[str, int] = {}
        """Bytes read from each source, and received from other ranks (``peers``)."""

    def read(self, task: Task, label: str) -> None:
        self.bytes_by_source[label] = self.bytes_by_source.get(label, 0) + task.length
        if label == "local" and task.file not in self.local_hits:
            self.local_hits.append(task.file)

    def received(self, task: Task) -> None:
        self.bytes_by_source["peers"] = self.bytes_by_source.get("peers", 0) + task.length


class CkptioStorageReader(StorageReader):
    """A DCP StorageReader over any ckptio storage: ranged, verified, shared reads; the local tier preferred.

    The keyword constructor is for DCP users; ckptio's own restore builds readers with :meth:`in_context`.
    """

    def __init__(self, storage: ReadStore, step: int | None, *, manifest: Manifest | None = None,
                 local: ReadStore | None = None, concurrency: int = 4, trust_pickles: bool = False,
                 safe_globals: Sequence[Any] = (), process_group: Any = None, chunk_bytes: int = CHUNK_BYTES,
                 exchange: bool = True, extension_registry: Any = None) -> None:
        """``step``: the committed step of a ckptio root to read, or a step directory of it that a plain
        ``dcp.save`` wrote; None: ``storage``'s root is itself a plain DCP directory. ``extension_registry``: DCP's
        ``ExtensionRegistry`` for items stored through stream extensions (None: DCP's default, ZStandard)."""
        options = ReadOptions(concurrency=concurrency, trust_pickles=trust_pickles, safe_globals=tuple(safe_globals),
                              chunk_bytes=chunk_bytes, exchange=exchange, extension_registry=extension_registry)
        if manifest is None and step is not None:
            manifest = _manifest_or_plain(storage, step)
        self._open(storage, manifest, step=step, local=local, process_group=process_group, options=options)

    @classmethod
    def in_context(cls, ctx: RestoreContext, step: int, manifest: Manifest | None) -> CkptioStorageReader:
        """The reader of ``step`` on the durable root of ``ctx`` (its local tier preferred): a committed step
        (``manifest``), or a plain DCP checkpoint in the step's directory (None)."""
        reader = cls.__new__(cls)
        reader._open(ctx.durable, manifest, step=step, local=ctx.local, process_group=ctx.process_group,
                     options=ctx.options)
        return reader

    def _open(self, storage: ReadStore, manifest: Manifest | None, *, step: int | None, local: ReadStore | None,
              process_group: Any, options: ReadOptions) -> None:
        self.storage = storage
        self.step = step if step is not None else 0
        """The step read (0 for a plain DCP directory at the store's root, which has none)."""
        self.plain = manifest is None
        """A plain DCP checkpoint: no manifest, no rank index; a manifest is made from ``.metadata`` and the files'
        real sizes (:func:`~ckptio.format.plain_dcp.plain_manifest`), and every item is checked by its zip CRC-32."""
        self.prefix = step_dir(step) if step is not None else ""
        self.manifest = manifest if manifest is not None else Manifest(step=step or 0, world_size=0, save_id=0,
                                                                        files={}, total_bytes=0)
        self.local = local if not self.plain else None  # the local tier holds ckptio's own steps only
        self.options = options
        self.process_group = process_group
        """The group ``dcp.load`` runs on (None: the default group, as DCP's own default)."""
        self.storage_data: dict[MetadataIndex, _StorageInfo] = {}
        self._metadata: Metadata | None = None
        self._given_metadata: bytes | None = None
        self._rank = 0
        self.tally = self._new_tally()
        self.failure: CkptError | None = None
        """What stopped this rank's exchange in the last ``read_data`` (:func:`~ckptio.engine.restore.dcp_load.
        load_through` raises it when DCP's own collectives fail after it)."""

    def _new_tally(self) -> ReadTally:
        return ReadTally()

    def reset(self, checkpoint_id: Any = None) -> None:
        self.tally = self._new_tally()
        self.failure = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False

    # ---- metadata -----------------------------------------------------------------------------------------
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checked metadata, read once: restore reads it before ``dcp.load`` so that a refusal surfaces as
        ckptio's own error rather than inside DCP's wrapping."""
        if self._metadata is not None:
            return self._metadata
        name = ".metadata"
        key = self.metadata_key()
        raw = self._given_metadata if self._given_metadata is not None else self.storage.get(key)
        if self.manifest.metadata_crc32c:
            check_file(self.storage, self.step, name, raw,
                       FileRecord(name=name, size=len(raw), crc32c=self.manifest.metadata_crc32c))
        try:
            metadata = cast(Metadata, load_metadata(raw, path=key, trust_pickles=self.options.trust_pickles))
        except CorruptCheckpointError as exc:
            raise self._located(exc) from exc.__cause__
        if self.plain:
            self.manifest = plain_manifest(self.storage, self.prefix, self.step, metadata)
        problems = metadata_problems(metadata, self.manifest)
        if problems:
            # Reads must stay inside the files the manifest lists (and checksums): never a KeyError or a short read.
            raise CorruptCheckpointError(f".metadata disagrees with the manifest: {problems[0]}",
                                         root=self.storage.url, step=self.step, path=key)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        self._metadata = metadata
        return metadata

    def given_metadata(self, raw: bytes | None) -> None:
        """``.metadata``'s bytes as rank 0 read them for every rank (None: this rank reads its own); checked here
        exactly as if read here."""
        self._given_metadata = raw

    def metadata_key(self) -> str:
        """Where ``.metadata`` is read from (the local level's reader reads its own)."""
        return join_key(self.prefix, METADATA) if self.prefix else METADATA

    def _located(self, exc: CorruptCheckpointError) -> CorruptCheckpointError:
        exc.root, exc.step = exc.root or self.storage.url, self.step
        return exc

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._metadata = metadata
        self.storage_data = metadata.storage_data
        self._rank = int(kwargs.get("rank", self._group_rank()))

    # ---- planning (coordinator) ---------------------------------------------------------------------------
    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        layout = self._layout()
        shapes = self._shapes()
        needs = [[(req.storage_index, *self._need(req, layout.places[req.storage_index], shapes)) for req in p.items]
                 for p in plans]
        self._check_claims({layout.places[req.storage_index].file for p in plans for req in p.items})
        exchange = len(plans) == 1 or (self.options.exchange and self._group_moves_cpu(len(plans)))
        reads = plan_reads(needs, layout, exchange=exchange, readers_of=self._readers_of,
                           chunk=self.options.chunk_bytes)
        return [dataclasses.replace(p, storage_data=r) for p, r in zip(plans, reads, strict=True)]

    @staticmethod
    def _need(req: ReadItem, place: Place, shapes: dict[MetadataIndex, ChunkShape]) -> tuple[int, int]:
        shape = shapes.get(req.storage_index) if req.type != LoadItemType.BYTE_IO else None
        return need_range(place, req.storage_offsets, req.lengths, shape)

    def _shapes(self) -> dict[MetadataIndex, ChunkShape]:
        assert self._metadata is not None
        return chunk_shapes(self._metadata)

    def _layout(self) -> StoreLayout:
        """Places and blocks of every item (:mod:`ckptio.engine.restore.step_layout`)."""
        if self.plain:
            return build_plain_layout(self.storage_data)
        records = read_item_records(self.storage, self.manifest, lambda rank: index_key(self.step, rank))
        return build_layout(self.storage_data, records, self._shapes(), self.manifest.files)

    def _check_claims(self, names: set[str]) -> None:
        """Hold the manifest's sizes of the files a plan reads to the objects' real sizes, before any rank allocates
        by them (the durable copies: the local tier's are checked by every read that uses them)."""
        check_real_sizes(self.storage, self.manifest, names)

    def _readers_of(self, name: str) -> Sequence[int] | None:
        """The ranks that may read ``name`` (None: any)."""
        return None

    # ---- the group ----------------------------------------------------------------------------------------
    def _group(self) -> Any:
        if self.process_group is not None:
            return self.process_group
        return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None

    def _group_rank(self) -> int:
        group = self._group()
        return dist.get_rank(group) if group is not None else 0

    def _group_moves_cpu(self, world: int) -> bool:
        return moves_cpu_tensors(self._group(), world)

    # ---- reading (every rank) -----------------------------------------------------------------------------
    def _sources(self, name: str) -> list[Source]:
        """Where ``name`` can be read, best first: the local tier's copy, then the durable one."""
        rec = self.manifest.files[name]
        out = []
        if self.local is not None:
            local, plain = self.local, join_key(step_dir(self.step), name)  # the local tier never hashes keys
            out.append(Source("local", lambda offset, bufs: local.readinto(plain, bufs, offset=offset)))
        durable, key = self.storage, record_key(self.step, rec)
        out.append(Source("durable", lambda offset, bufs: durable.readinto(key, bufs, offset=offset)))
        return out

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        reads, rank = plan.storage_data, self._rank
        shapes = self._shapes()
        if not isinstance(reads, RankReads):
            # A custom planner rebuilt the plan without our share (on every rank alike): read alone, no exchange.
            layout = self._layout()
            needs = [(req.storage_index, *self._need(req, layout.places[req.storage_index], shapes))
                     for req in plan.items]
            reads, rank = plan_reads([needs], layout, exchange=False, chunk=self.options.chunk_bytes)[0], 0
        streams: dict[torch.device, Any] = {}
        hooks = self._hooks(planner, streams)
        dests: list[Dest] = []
        error: CkptError | None = None
        try:
            for req in plan.items:
                dests.append(make_dest(req, reads.places[req.storage_index],
                                       shapes.get(req.storage_index) if req.type != LoadItemType.BYTE_IO else None,
                                       planner, hooks))
        except CkptError as exc:
            error = exc
        group = self._group()
        if reads.exchange and group is not None and any_true_in(group, error is not None):
            if error is not None:
                raise error
            return _done()  # another rank could not start: it raises; nobody exchanges anything
        if error is not None:
            raise error
        self._transfer(reads, dests, planner, streams=streams, group=group, rank=rank)
        return _done()

    def _transfer(self, reads: RankReads, dests: list[Dest], planner: LoadPlanner, *, streams: dict[Any, Any],
                  group: Any, rank: int) -> None:
        deferred: list[Dest] = []
        unloadable: list[CkptError] = []

        def done(dest: Dest) -> None:
            if dest.deferred:
                deferred.append(dest)
                return
            try:
                dest.finish(planner)
            except CkptError as exc:  # raised once the walk is over: the other ranks still wait for our sends
                unloadable.append(exc)

        for dest in dests:
            if dest.remaining == 0:
                done(dest)
        spec = TransferSpec(rank=rank, group=group, step=self.step, root=self.storage.url,
                            concurrency=self.options.concurrency, chunk=self.options.chunk_bytes,
                            pinned=any(isinstance(d, StreamDest) and d.stream is not None for d in dests),
                            batch_bytes=self.storage.read_batch_bytes)
        transfer = Transfer(spec, self._sources, self.tally)
        try:
            transfer.run(reads.tasks, dests, done)
        except CkptError as exc:
            self.failure = exc  # DCP's gather of the outcome cannot carry it when a peer is gone
            raise
        finally:
            for stream in streams.values():
                stream.synchronize()
        if unloadable:
            raise unloadable[0]
        for dest in deferred:
            dest.finish(planner)

    def _hooks(self, planner: LoadPlanner, streams: dict[torch.device, Any]) -> DestHooks:
        opener = BlobOpener(self.storage_data, registry=self.options.extension_registry, check_zip=self.plain,
                            root=self.storage.url, step=self.step)
        return DestHooks(step=self.step, open_blob=opener,
                         load_object=lambda req, blob: self._load_object(req, blob, planner),
                         stream_for=lambda t: _side_stream(streams, t))

    def _load_object(self, req: ReadItem, blob: bytes | memoryview, planner: LoadPlanner) -> None:
        """A non-tensor value: loaded here with the allowlist, never by DCP's planner (which unpickles anything)."""
        if self.options.trust_pickles:
            planner.load_bytes(req, io.BytesIO(blob))
            return
        try:
            value = load_object(blob, safe_globals=self.options.safe_globals, path=req.storage_index.fqn)
        except CorruptCheckpointError as exc:
            raise self._located(exc) from exc.__cause__
        if isinstance(planner, DefaultLoadPlanner) and type(planner).load_bytes is DefaultLoadPlanner.load_bytes:
            # What DefaultLoadPlanner.load_bytes does after its torch.load(weights_only=False).
            if planner.flatten_state_dict:
                set_element(planner.original_state_dict, planner.mappings[req.dest_index.fqn], value)
            else:
                planner.state_dict[req.dest_index.fqn] = value
            return
        # A custom planner loads bytes its own way: hand it a re-serialization of the value the allowlisted load
        # built, so whatever it unpickles names only classes that load admitted.
        buf = io.BytesIO()
        torch.save(value, buf)
        buf.seek(0)
        planner.load_bytes(req, buf)


def _side_stream(streams: dict[Any, Any], target: torch.Tensor) -> Any:
    """The side stream of ``target``'s device (None for CPU targets): host-to-device copies overlap the reads."""
    if target.device.type != "cuda":
        return None
    if target.device not in streams:
        streams[target.device] = torch.cuda.Stream(device=target.device)
    return streams[target.device]


def _done() -> Future[None]:
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


def _manifest_or_plain(storage: ReadStore, step: int) -> Manifest | None:
    """``step``'s manifest, or None when its directory is a plain DCP checkpoint; CheckpointNotFoundError (naming
    the missing manifest) when it is neither."""
    try:
        return read_manifest(storage, step)
    except CheckpointNotFoundError as exc:
        if isinstance(storage, Storage) and is_plain_dcp(storage, step):
            return None
        raise CheckpointNotFoundError(f"no committed checkpoint for this step: {step_dir(step)}/{MANIFEST} is missing "
                                      "and the directory is not a plain DCP checkpoint either", root=storage.url,
                                      step=step) from exc
