"""The trainer<->writer messages: frozen, picklable, and the writer's config is a projection of the user's."""

from __future__ import annotations

import dataclasses
import json
import pickle
from multiprocessing import Pipe

import pytest

from ckptio.config import CheckpointerConfig, WriterConfig
from ckptio.engine import protocol
from ckptio.errors import CommitError
from ckptio.format.layout import RankLayout
from ckptio.obs.events import EVENTS, Event, EventLog, Phase, make_record
from ckptio.policy.residency import resolve_residency
from ckptio.storage import open_storage


def _messages(tmp_path) -> list[object]:
    storage = open_storage(str(tmp_path), fsync=False)
    config = CheckpointerConfig(root=str(tmp_path), keep_last=7, writer_nice=3).writer_config()
    layout = RankLayout(rank=0, tensors=(), objects=(), slot_bytes=0, n_files=1)
    return [
        protocol.WriterStart(config=config, rank=0, world_size=1, durable=storage, local=None, owner=None),
        protocol.WriterPlan(1, layout, metadata_skeleton=None),
        protocol.SaveJob(step=3, save_id=9, slot_id=0, slot_path="/dev/shm/x", slot_nbytes=8, plan_id=1,
                         objects=(b"a",), rollback=protocol.Rollback(above=2, own_save_ids=(9,))),
        protocol.SaveReserve(3),
        protocol.SaveRelease(3),
        protocol.WriterStop(),
        protocol.WriterEvent(make_record(Event.QUEUE, 3, rank=0, role="writer", pending=1)),
        protocol.Reserved(3),
        protocol.SlotFree(step=3, save_id=9, slot_id=0),
        protocol.SaveDone(3, 9, protocol.CommitInfo(total_bytes=10, files=1)),
        protocol.SaveFailed(3, 9, CommitError("boom", step=3)),
        protocol.WriterStopped(),
    ]


def test_messages_are_frozen_and_survive_the_pipe(tmp_path):
    for msg in _messages(tmp_path):
        assert type(pickle.loads(pickle.dumps(msg))) is type(msg)
        fields = dataclasses.fields(msg)  # type: ignore[arg-type]
        if fields:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(msg, fields[0].name, None)


def test_writer_config_is_the_checkpointer_config_projected(tmp_path):
    config = CheckpointerConfig(root=str(tmp_path), keep_last=7, upload_concurrency=2, commit_timeout_s=5.0,
                                residency_recheck_s=9.0, local_capacity_bytes=1 << 30, writer_nice=0)
    writer = config.writer_config()
    for f in dataclasses.fields(WriterConfig):
        expected = getattr(config, f.name)
        if f.name == "residency":  # the one in force: the default (public buckets refused) when none is given
            expected = resolve_residency(config.residency, allow_public=config.allow_public,
                                         store_private=config.store_private)
        assert getattr(writer, f.name) == expected


def test_the_outbox_sends_validated_event_records():
    ours, theirs = Pipe()
    out = protocol.Outbox(theirs, rank=2)
    out.event(Event.PHASE, 5, phase=Phase.UPLOAD, seconds=0.1, bytes=3, tier="durable")
    msg = ours.recv()
    assert isinstance(msg, protocol.WriterEvent)
    line = json.loads(json.dumps(msg.record))
    assert line["event"] == "phase" and line["phase"] == "upload" and line["role"] == "writer"
    assert line["rank"] == 2 and line["step"] == 5
    with pytest.raises(ValueError, match="unknown event"):
        out.event("no_such_event", 5)  # type: ignore[arg-type]


def test_event_names_are_one_enum():
    assert {e.value for e in Event} == EVENTS
    log = EventLog(None, rank=0, role="trainer")
    assert log.emit("queue", 1, pending=0)["event"] == "queue"  # plain strings still accepted
    with pytest.raises(ValueError, match="unknown event"):
        log.emit("quue", 1)
