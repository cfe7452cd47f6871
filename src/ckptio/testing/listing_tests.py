"""The listing half of the storage conformance kit: ``list``, ``list_dirs``, ``delete`` and ``delete_prefix``.

Mixed into :class:`~ckptio.testing.conformance.StoreTests`. What it pins is what commit, retention and the local
tier rely on when they look for steps: one listing contract for every backend and wrapper. Never imports the
engine.
"""

from __future__ import annotations

from ckptio.storage.base import Storage

__all__ = ["ListingTests"]


class ListingTests:
    """Listings and deletions; subclasses provide a ``storage`` fixture (an empty key space)."""

    def _populate_steps(self, storage: Storage) -> None:
        for key in ("step-00000100/a", "step-00000100/ranks/0.json", "step-00000200/a", "latest", "step-1/x"):
            storage.put(key, key.encode())

    def test_list_prefixes(self, storage: Storage) -> None:
        self._populate_steps(storage)
        everything = {i.key: i for i in storage.list()}
        assert set(everything) == {
            "step-00000100/a",
            "step-00000100/ranks/0.json",
            "step-00000200/a",
            "latest",
            "step-1/x",
        }
        assert everything["latest"].size == len(b"latest")
        assert {i.key for i in storage.list("step-00000100/")} == {
            "step-00000100/a",
            "step-00000100/ranks/0.json",
        }
        # A prefix ending inside a name matches like a string prefix, as on S3.
        assert {i.key for i in storage.list("step-000001")} == {
            "step-00000100/a",
            "step-00000100/ranks/0.json",
        }
        assert {i.key for i in storage.list("step-00000100/ranks/0")} == {"step-00000100/ranks/0.json"}
        assert {i.key for i in storage.list("lat")} == {"latest"}
        assert list(storage.list("nothing-here")) == []
        assert list(storage.list("nothing/here/")) == []

    def test_list_etags_match_head(self, storage: Storage) -> None:
        self._populate_steps(storage)
        for info in storage.list():
            assert storage.head(info.key) == info

    def test_list_dirs(self, storage: Storage) -> None:
        self._populate_steps(storage)
        assert storage.list_dirs() == ["step-00000100", "step-00000200", "step-1"]
        assert storage.list_dirs("step-00000100") == ["ranks"]
        assert storage.list_dirs("missing") == []

    def test_list_dirs_lists_one_level_of_names(self, storage: Storage) -> None:
        for key in ("top", "a/x", "a/b/c/deep", "h-00ff/step-00000001/x", ".hidden/y"):
            storage.put(key, b"1")
        assert storage.list_dirs() == [".hidden", "a", "h-00ff"], "names one level down; never a key, never deeper"
        assert storage.list_dirs("a") == storage.list_dirs("a/") == ["b"]
        assert storage.list_dirs("a/b") == ["c"]
        assert storage.list_dirs("top") == [], "a key is not a directory"
        # Once nothing is stored below a name it may go (POSIX removes empty directories, S3 lists none) or stay
        # (SeaweedFS keeps its directory entries): callers treat names as candidates. Never anything new.
        storage.delete("a/b/c/deep")
        assert set(storage.list_dirs("a")) <= {"b"}
        storage.delete("a/x")
        assert {".hidden", "h-00ff"} <= set(storage.list_dirs()) <= {".hidden", "a", "h-00ff"}

    def test_delete(self, storage: Storage) -> None:
        storage.put("d/x", b"1")
        storage.put("d/y", b"2")
        storage.delete("d/x")
        assert not storage.exists("d/x")
        assert storage.get("d/y") == b"2"
        storage.delete("d/x")  # missing is fine
        storage.delete("never/was")

    def test_delete_prefix_stops_at_segment_boundary(self, storage: Storage) -> None:
        self._populate_steps(storage)
        storage.put("step-10/y", b"y")
        assert storage.delete_prefix("step-1") == 1
        assert storage.exists("step-10/y")
        assert storage.delete_prefix("step-00000100") == 2
        assert {i.key for i in storage.list()} == {"step-00000200/a", "latest", "step-10/y"}
        assert storage.delete_prefix("absent") == 0
