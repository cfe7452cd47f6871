"""Where everything lives under a root: step directories, rank indexes, manifests, ``latest``, data keys.

Only canonical names count: exactly what :func:`step_dir` writes (``step-`` and the step zero-padded to eight
digits, more only when the step needs them). ``step-0000000099`` is junk, not an alias of step 99.

It also owns the containment rule for keys a manifest may name (:func:`check_data_key`): a step's data lives in
its own directory or under a hash directory followed by its own step directory, and nowhere else.

And it owns **the rule by which ckptio knows its own keys** (:func:`is_own_key`), so that nothing ckptio did not
write is ever deleted: within a step directory, ckptio writes only ``manifest.json``, ``supersede.json``,
``commit.lock``, ``ranks/<rank>.json``, ``failed/<who>.json``, data files named with their save attempt
(``__<rank>_<n>-<attempt hex>.distcp``, see ``layout.data_file_name``) and ``.metadata``. A plain DCP checkpoint
(``.metadata`` beside ``__0_0.distcp``) or a user's own folder holds none of the first six, so it is not ckptio's
(:func:`is_own_step`), and ``.metadata`` counts as ckptio's only in a directory where nothing foreign remains.
This module computes and checks names; it never reads or writes storage.
"""

from __future__ import annotations

import re

from ckptio.errors import CorruptCheckpointError
from ckptio.storage.base import HASHED_DIR_PREFIX, Storage, join_key

MANIFEST = "manifest.json"
METADATA = ".metadata"
LATEST = "latest"
RANKS_DIR = "ranks"
FAILED_DIR = "failed"
SUPERSEDE = "supersede.json"
"""A supersede in progress (``format.rollback``): the step's old and new manifests until the new one is in place."""
COMMIT_LOCK = "commit.lock"
MANIFEST_FORMAT = "ckptio-manifest/1"
INDEX_FORMAT = "ckptio-rank-index/1"
_STEP_RE = re.compile(r"^step-(\d{8,})$")
# A data file's name within its step directory: one plain path segment, no separators, no dot-only names.
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]*$")
_HASH_DIR_RE = re.compile(rf"^{re.escape(HASHED_DIR_PREFIX)}[0-9a-f]{{1,16}}$")
# layout.data_file_name: DCP's __{rank}_{n} plus the save attempt in hex (13 digits or more). DCP itself writes
# __{rank}_{n}.distcp, without the attempt: never ckptio's.
_OWN_DATA_RE = re.compile(r"^__\d+_\d+-[0-9a-f]{13,}\.distcp$")
_OWN_RECORD_RE = re.compile(rf"^(?:{RANKS_DIR}/\d+\.json|{FAILED_DIR}/[A-Za-z0-9_.-]+\.json)$")
_OWN_NAMES = frozenset({MANIFEST, SUPERSEDE, COMMIT_LOCK})


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """The step a directory name stands for, or None unless the name is exactly ``step_dir(step)``."""
    m = _STEP_RE.match(name)
    if m is None:
        return None
    step = int(m.group(1))
    return step if step_dir(step) == name else None


def is_own_data_name(name: str) -> bool:
    """Is ``name`` a data file name ckptio writes (with its save attempt), not DCP's plain ``__0_0.distcp``?"""
    return bool(_OWN_DATA_RE.match(name))


def is_own_key(rest: str) -> bool:
    """Is ``rest`` (a key below a step directory) one that only ckptio writes? ``.metadata`` is not: DCP writes it
    too, so it goes only with a directory that holds nothing foreign (:func:`own_keys_to_delete`)."""
    return rest in _OWN_NAMES or bool(_OWN_RECORD_RE.match(rest)) or is_own_data_name(rest)


def is_own_step(rests: list[str]) -> bool:
    """Does a step directory holding ``rests`` (keys below it) show a ckptio attempt? One key only ckptio writes."""
    return any(is_own_key(rest) for rest in rests)


def own_keys_to_delete(rests: list[str]) -> list[str]:
    """Of a ckptio step directory's keys ``rests``, those cleanup may delete, in the order to delete them:
    ``.metadata`` first when nothing foreign stays beside it, then ckptio's own keys. Nothing of a directory ckptio
    never wrote to.

    ``.metadata`` goes first so that a deletion a crash interrupts never leaves a directory that looks like a plain
    DCP checkpoint (``.metadata`` without a manifest or a rank index) with files missing: ``verify``, ``restore``'s
    plain-DCP fallback and ``dcp.load`` would take it for a broken checkpoint."""
    if not is_own_step(rests):
        return []
    own = [rest for rest in rests if is_own_key(rest)]
    foreign = [rest for rest in rests if rest not in own and rest != METADATA]
    return ([METADATA] if METADATA in rests and not foreign else []) + own


def check_file_name(name: str, *, step: int, path: str = "") -> None:
    """Raise CorruptCheckpointError unless ``name`` is a plain file name (one segment, no ``..``, no ``/``)."""
    if not isinstance(name, str) or not _FILE_NAME_RE.match(name) or len(name) > 255:
        raise CorruptCheckpointError(f"data file name {name!r} is not a plain file name", step=step, path=path)


def check_data_key(key: str, name: str, *, step: int, path: str = "") -> None:
    """Raise CorruptCheckpointError unless ``key`` is where step ``step`` may keep its data file ``name``:
    ``step-XXXXXXXX/<name>`` or ``h-<hex>/step-XXXXXXXX/<name>``. Anything else (another step's file, ``..``,
    an absolute key, a file elsewhere under the root) is a manifest retention and restore must not follow."""
    check_file_name(name, step=step, path=path)
    parts = key.split("/") if isinstance(key, str) else []
    own = parts[-2:] == [step_dir(step), name]
    if own and (len(parts) == 2 or (len(parts) == 3 and _HASH_DIR_RE.match(parts[0]))):
        return
    raise CorruptCheckpointError(f"data key {key!r} of {name!r} lies outside step {step}'s own keys",
                                 step=step, path=path)


def hash_prefix_enabled(storage: Storage) -> bool:
    """True when ``storage`` puts data files under hash directories (its ``hash_prefix`` capability)."""
    return storage.hash_prefix


def durable_data_key(storage: Storage, step: int, name: str) -> str:
    """Where a data file goes on the durable tier: under a short hash directory when the storage asks for it
    (spreads S3 partitions), else in the step directory. The manifest records the real key."""
    return storage.data_key(join_key(step_dir(step), name))


def index_key(step: int, rank: int) -> str:
    return join_key(step_dir(step), RANKS_DIR, f"{rank}.json")


def supersede_key(step: int) -> str:
    return join_key(step_dir(step), SUPERSEDE)


def failed_key(step: int, who: str) -> str:
    return join_key(step_dir(step), FAILED_DIR, f"{who}.json")


def manifest_key(step: int) -> str:
    return join_key(step_dir(step), MANIFEST)
