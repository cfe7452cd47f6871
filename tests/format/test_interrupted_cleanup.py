"""A cleanup that a crash interrupts never leaves a directory that looks like a plain DCP checkpoint with files
missing: ``.metadata`` is deleted before ckptio's own files.

Found by tests/engine/test_crash.py under load: a kill -9 landed between the deletes of a leftover attempt (data
and rank index gone, ``.metadata`` left), and ``ckptio verify`` then failed the root on a "plain DCP checkpoint"
that names a missing file. Here the crash is a storage that stops after its first delete (a stand-in for the kill at
that instant, which a real kill cannot aim at), on real files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptio.format.keys import METADATA, own_keys_to_delete, step_dir
from ckptio.format.plain_dcp import is_plain_dcp
from ckptio.format.retention import delete_own_keys
from ckptio.format.verify import verify_levels
from ckptio.storage import PosixStorage
from ckptio.storage.storage_wrapper import StorageWrapper


class Killed(Exception):
    """The process died here."""


class DiesAfterDeletes(StorageWrapper):
    def __init__(self, inner: PosixStorage, deletes: int) -> None:
        super().__init__(inner)
        self.left = deletes

    def delete(self, key: str) -> None:
        if self.left == 0:
            raise Killed(key)
        self.left -= 1
        self.inner.delete(key)


def _leftover_attempt(root: Path) -> list[str]:
    """A ckptio attempt at step 3 that never committed: a data file, a rank index and ``.metadata``."""
    step = root / step_dir(3)
    (step / "ranks").mkdir(parents=True)
    (step / "__0_0-c695a1af78832.distcp").write_bytes(b"x" * 64)
    (step / "ranks" / "0.json").write_text("{}")
    (step / METADATA).write_bytes(b"not read")
    return sorted(str(p.relative_to(step)) for p in step.rglob("*") if p.is_file())


def test_metadata_is_deleted_first() -> None:
    rests = ["__0_0-c695a1af78832.distcp", "ranks/0.json", METADATA]
    assert own_keys_to_delete(rests)[0] == METADATA
    assert sorted(own_keys_to_delete(rests)) == sorted(rests)


@pytest.mark.parametrize("deletes", [0, 1, 2])
def test_a_cleanup_cut_short_leaves_no_plain_dcp_lookalike(tmp_path: Path, deletes: int) -> None:
    rests = _leftover_attempt(tmp_path)
    storage = PosixStorage(tmp_path, fsync=False)
    with pytest.raises(Killed):
        delete_own_keys(DiesAfterDeletes(storage, deletes), 3)
    assert len(list((tmp_path / step_dir(3)).rglob("*.*"))) <= len(rests)  # some of it is still there
    assert not is_plain_dcp(storage, 3)
    assert [r for r in verify_levels(storage) if not r.ok] == []  # what `ckptio verify` reports
