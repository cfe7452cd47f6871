"""The partner channel of the local level: writer-to-writer copies that only the job's own processes can make.

- :mod:`.auth`: the job's secret (:func:`agree_secret`, drawn by rank 0, sent over the side group) and the
  handshake + MAC'd headers every connection runs on.
- :mod:`.server`: :class:`PartnerServer`, one per writer: ``put`` (store a partner copy after its crc32c and
  digest check out) and ``get`` (stream a held file), with bounded connections, deadlines and memory.
- :mod:`.client`: :func:`send_files` (stream, hash, send: returns the digests the local rank index records) and
  :func:`fetch_verified` (stream to disk, keep only on a digest match).
- :mod:`.digest`: the digest (SHA-256) and its checks; :mod:`.files`: temp files and their cleanup;
  :mod:`.limits`: :class:`PartnerLimits`.

What the channel protects, and what it does not, is in docs/security.md ("The partner channel").
"""

from ckptio.engine.partner.auth import agree_secret
from ckptio.engine.partner.client import fetch_verified, send_files
from ckptio.engine.partner.digest import bytes_digest, check_digest, file_digest, verify_file_digest
from ckptio.engine.partner.limits import PartnerLimits
from ckptio.engine.partner.server import PartnerServer

__all__ = [
    "PartnerLimits",
    "PartnerServer",
    "agree_secret",
    "bytes_digest",
    "check_digest",
    "fetch_verified",
    "file_digest",
    "send_files",
    "verify_file_digest",
]
