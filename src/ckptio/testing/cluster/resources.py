"""What one lab owns (namespaces, mounts, processes, its directory), written down as it is made, and removed by id.

Rules:
- Every resource is recorded in ``<lab dir>/state.json`` *before* it is made and forgotten only once it is gone,
  so a lab whose owner crashed can be cleaned up later by :func:`cleanup_stale`, from that record alone.
- Teardown removes each resource by its own id or name: processes by (pid, start time), mounts by path, namespaces
  by name. It never matches a broad pattern, it goes on past individual errors (reporting them together), and it
  is idempotent: a second call finds nothing left to do.
- Order matters: launched jobs first (they hold files on the mounts), then the mounts (a FUSE mount is unmounted
  by path before its client process is stopped), then the storage daemons, then whatever is still inside a lab
  namespace (``ip netns pids``: by namespace), then the namespaces themselves, and the directory last, and only
  when no mount is left under it (a recursive delete must never walk into a live mount).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ckptio.testing.cluster import netns
from ckptio.testing.cluster.procs import LabError, Proc, is_zombie, kill_recorded, run, spawn, start_time

STATE_FILE = "state.json"
DAEMON_GRACE_S = 0.5


def mounted(path: Path | str) -> bool:
    """True when ``path`` is a mount point in this mount namespace (by path, from ``/proc/mounts``)."""
    return str(path) in mount_points()


def mount_points() -> set[str]:
    points = set()
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 1:
                points.add(fields[1].replace("\\040", " "))
    return points


def unmount(path: Path | str) -> None:
    """Unmount by path; a lazy unmount when the plain one fails (a FUSE client that died leaves a stale mount)."""
    if not mounted(path):
        return
    if run(["umount", str(path)], check=False).returncode != 0 and mounted(path):
        run(["umount", "-l", str(path)], check=False)


class Resources:
    """The record of one lab. ``spawn`` starts a process (inside a lab namespace when ``ns`` is given) and records
    it; ``teardown`` removes everything recorded."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.owner = (os.getpid(), start_time(os.getpid()) or -1)
        self.namespaces: list[str] = []
        self.mounts: list[str] = []
        self.daemons: list[Proc] = []
        self.jobs: list[Proc] = []
        self.errors: list[str] = []
        self.lock = threading.RLock()

    # ---- recording ------------------------------------------------------------------------------------------
    def save(self) -> None:
        """Write the record (under a lock: jobs may be launched and forgotten from several threads)."""
        with self.lock:
            record = {"owner": list(self.owner), "namespaces": self.namespaces, "mounts": self.mounts,
                      "procs": [p.record() for p in [*self.jobs, *self.daemons]]}
            tmp = self.dir / (STATE_FILE + ".tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.dir / STATE_FILE)

    def add_namespace(self, name: str) -> None:
        self.namespaces.append(name)
        self.save()
        netns.add(name)

    def add_mount(self, path: Path) -> None:
        if str(path) not in self.mounts:
            self.mounts.append(str(path))
            self.save()

    def spawn(self, argv: Sequence[str], *, name: str, ns: str | None = None, job: bool = False,
              log: Path | None = None, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
              stdout: int | IO[Any] | None = None, text: bool = False) -> Proc:
        """Start and record a process; ``job`` ones (ranks, loaders) are stopped before the mounts go."""
        full = netns.enter_argv(ns, argv) if ns else list(argv)
        proc = spawn(full, name=name, log=log, env=env, cwd=cwd, stdout=stdout, text=text)
        with self.lock:
            (self.jobs if job else self.daemons).append(proc)
        self.save()
        return proc

    def forget(self, proc: Proc) -> None:
        with self.lock:
            for group in (self.jobs, self.daemons):
                if proc in group:
                    group.remove(proc)
        self.save()

    # ---- teardown -------------------------------------------------------------------------------------------
    def _try(self, what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # go on with the rest; every error is reported at the end
            self.errors.append(f"{what}: {exc}")

    def teardown(self) -> list[str]:
        """Remove everything; returns the errors met (empty when all went). Safe to call again."""
        for proc in list(self.jobs):
            self._try(f"stop {proc.name}", proc.stop, 0.0)
        for path in list(self.mounts):
            self._try(f"unmount {path}", unmount, path)
        self._try("stop the daemons", stop_all, list(reversed(self.daemons)))
        for name in self.namespaces:
            self._try(f"kill what is left in {name}", kill_namespace, name)
        for name in reversed(self.namespaces):
            self._try(f"delete namespace {name}", netns.delete, name)
        self._try("remove lab directory", self._remove_dir)
        self.jobs.clear()
        self.daemons.clear()
        errors, self.errors = self.errors, []
        return errors

    def _remove_dir(self) -> None:
        still = [m for m in self.mounts if mounted(m)]
        if still:
            raise LabError(f"left {self.dir} in place: still mounted {still}")
        self.mounts.clear()
        self.namespaces = [n for n in self.namespaces if netns.ns_path(n).exists()]
        if self.namespaces:
            self.save()
            raise LabError(f"namespaces left: {self.namespaces}")
        shutil.rmtree(self.dir, ignore_errors=True)


def stop_all(procs: Sequence[Proc], grace_s: float = DAEMON_GRACE_S) -> None:
    """SIGTERM them all at once, then SIGKILL whatever still runs after ``grace_s``. The lab throws their data
    away, so no daemon needs a clean shutdown; the grace only lets FUSE clients leave after their unmount."""
    for proc in procs:
        proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        proc.stop(0.0)


def kill_namespace(name: str) -> None:
    """SIGKILL every process inside namespace ``name`` and wait for them to go (by namespace, not by pattern)."""
    found = netns.pids(name)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while found and time.monotonic() < deadline:
        found = [p for p in found if not is_zombie(p)]
        time.sleep(0.02)


def owner_alive(owner: Sequence[int]) -> bool:
    pid, started = int(owner[0]), int(owner[1])
    return start_time(pid) == started


def teardown_record(directory: Path) -> list[str]:
    """Remove what a dead lab's ``state.json`` lists: its processes (only those whose pid still names the recorded
    process), mounts by path, namespaces by name, then its directory."""
    record = json.loads((directory / STATE_FILE).read_text())
    errors: list[str] = []
    for pid, started, _name in record.get("procs", []):
        kill_recorded(int(pid), int(started))
    for path in record.get("mounts", []):
        unmount(path)
    for name in record.get("namespaces", []):
        kill_namespace(name)
        netns.delete(name)
        if netns.ns_path(name).exists():
            errors.append(f"namespace {name} could not be deleted")
    still = [m for m in record.get("mounts", []) if mounted(m)]
    if still:
        errors.append(f"still mounted: {still}")
    elif not errors:
        shutil.rmtree(directory, ignore_errors=True)
    return errors


_OWNED = re.compile(r"^ckl(\d+)-\d+(?:-|$)")


def cleanup_stale(base: Path) -> list[str]:
    """Remove what labs whose owning process is dead left behind: each recorded lab under ``base`` (from its
    ``state.json``), then any namespace named with the lab prefix (``ckl<pid>-<n>-...``) whose pid is dead. A lab
    whose owner still runs is never touched. Returns what was removed (and what could not be)."""
    done: list[str] = []
    if base.is_dir():
        for directory in sorted(base.iterdir()):
            state = directory / STATE_FILE
            if not _OWNED.match(directory.name) or not state.exists():
                continue
            try:
                owner = json.loads(state.read_text())["owner"]
            except (OSError, ValueError, KeyError):
                continue
            if owner_alive(owner):
                continue
            errors = teardown_record(directory)
            done.append(f"removed stale lab {directory.name}" + (f" ({'; '.join(errors)})" if errors else ""))
    for name in netns.listed():
        found = _OWNED.match(name)
        if found and start_time(int(found.group(1))) is None:
            kill_namespace(name)
            netns.delete(name)
            done.append(f"removed stale namespace {name}")
    return done
