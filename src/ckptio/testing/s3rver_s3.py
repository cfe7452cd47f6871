"""A second, independent S3 implementation for tests: s3rver (npm) on 127.0.0.1, a free port, a temp directory.

s3rver ignores ``If-None-Match`` and ``If-Match`` (a second create-only PUT replaces the object), and has no
public-access, policy-status, ACL or region API: it is the store the capability probe and the
``StoreCapabilityError`` refusals are tested against. moto (:mod:`ckptio.testing.moto_s3`, which honours them) is
the first. Each module is named after the server it runs (``<server>_s3``).

It is installed by the project's setup (``make s3rver``: ``npm ci`` of the pinned ``package.json`` at the repo
root into ``node_modules/``), never by this module. The server runs with ``--silent`` semantics and accepts any
access key (s3rver knows only its own ``S3RVER`` key; the launcher maps every unknown key to that account, and
s3rver does not verify SigV4 signatures), so the fake credentials of the session's moto server work for it too.
This module must never talk to anything but the server it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ckptio.errors import ConfigError

_START_TIMEOUT_S = 30.0
# Run with `node -e`: resolves s3rver from the given directory, accepts any access key, prints the port it bound.
_LAUNCHER = r"""
const [modDir, dataDir] = process.argv.slice(1);
const S3rver = require(modDir);
const AWSAccount = require(modDir + '/lib/models/account');
const known = AWSAccount.registry.get.bind(AWSAccount.registry);
AWSAccount.registry.get = (key) => known(key) || AWSAccount.DUMMY_ACCOUNT;
new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory: dataDir, allowMismatchedSignatures: true })
  .run()
  .then(({ port }) => { process.stdout.write(JSON.stringify({ port }) + '\n'); })
  .catch((err) => { process.stderr.write(String(err) + '\n'); process.exit(1); });
"""


def find_s3rver() -> Path | None:
    """The installed s3rver package directory: ``$CKPTIO_S3RVER_DIR``, or ``node_modules/s3rver`` in the current
    directory or the source checkout this module lives in."""
    candidates = []
    if os.environ.get("CKPTIO_S3RVER_DIR"):
        candidates.append(Path(os.environ["CKPTIO_S3RVER_DIR"]))
    candidates.append(Path.cwd() / "node_modules" / "s3rver")
    candidates.append(Path(__file__).resolve().parents[3] / "node_modules" / "s3rver")
    for path in candidates:
        if (path / "lib" / "s3rver.js").is_file():
            return path
    return None


def node_missing_reason() -> str | None:
    """Why s3rver cannot run on this machine at all (no Node.js), or None."""
    return None if shutil.which("node") else "s3rver needs Node.js (`node` is not on PATH)"


@contextlib.contextmanager
def run_s3rver() -> Iterator[str]:
    """Start s3rver in a fresh temp directory; yields its endpoint URL; stops it and removes the directory."""
    reason = node_missing_reason()
    if reason:
        raise ConfigError(reason)
    module = find_s3rver()
    if module is None:
        raise ConfigError("s3rver is not installed: run `make s3rver` (npm ci of the pinned package.json)")
    with tempfile.TemporaryDirectory(prefix="ckptio-s3rver-") as scratch:
        data, log_path = os.path.join(scratch, "data"), os.path.join(scratch, "stderr.log")
        os.mkdir(data)
        # stderr to a file, never a pipe nobody reads (a full pipe would stall the server).
        with open(log_path, "w") as log:
            proc = subprocess.Popen(["node", "-e", _LAUNCHER, str(module), data], stdout=subprocess.PIPE,
                                    stderr=log, text=True)
        try:
            yield f"http://127.0.0.1:{_read_port(proc, log_path)}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _read_port(proc: subprocess.Popen[str], log_path: str) -> int:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=_START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""
    if not line:
        with open(log_path) as f:
            err = f.read().strip()
        raise ConfigError(f"s3rver did not start within {_START_TIMEOUT_S:g} s: {err or 'no message'}")
    return int(json.loads(line)["port"])
