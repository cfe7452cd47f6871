"""The client side of the partner channel: send a rank's files to a partner (hashing them on the way), and fetch
a file from a holder node into a local path, kept only when it matches the digest in the durable record.

Copies may be paced (``partner_pace``): :func:`copy_rate` states the rule, and the writer's flush pacer
(engine.writer.flush_pacer) turns the rate into waits before each chunk, and releases them when a save needs the
fabric back at full speed.

Both authenticate first (:func:`~ckptio.engine.partner.auth.connect`) and stream in chunks: memory per transfer
is one chunk, whatever the file's size. Failures are named: ReplicationError (unreachable, refused, not
authenticated), NotFoundError (the holder does not have it), ChecksumError (the bytes are not the recorded ones).
"""

from __future__ import annotations

import time

from ckptio.engine.partner.auth import connect
from ckptio.engine.partner.digest import check_digest
from ckptio.engine.partner.files import receive_to_file, send_hashed
from ckptio.engine.partner.limits import PartnerLimits
from ckptio.errors import ChecksumError, CkptError, NotFoundError, ReplicationError
from ckptio.storage.base import Pacer

SendFile = tuple[str, str, int, str]
"""(name, local path, size, crc32c) of one file to copy."""


def copy_rate(node_bytes_per_s: float | None, ranks_on_node: int, limits: PartnerLimits) -> float | None:
    """One rank's partner-copy rate: an even share of its node's ``partner_pace`` (the node's ranks copy the same
    shapes at the same steps), never below the partner's minimum transfer rate: a slower copy would miss the
    partner's deadline and lose the redundancy it is for. None: full speed."""
    if node_bytes_per_s is None:
        return None
    return max(node_bytes_per_s / max(1, ranks_on_node), limits.min_rate)


def send_files(host: str, port: int, step: int, files: list[SendFile], *, secret: bytes, timeout_s: float,
               who: str, digests: dict[str, str] | None = None, limits: PartnerLimits | None = None,
               pacer: Pacer | None = None) -> dict[str, str]:
    """Copy ``files`` to the partner at ``host:port`` over one authenticated connection and return each file's
    digest, computed from the bytes as they were sent. With ``digests`` (from an earlier partner) nothing is
    hashed again and those are sent; the partner still checks them against what it receives. ReplicationError
    unless every file is acknowledged; each operation gets ``timeout_s``, each file the transfer deadline. With
    ``pacer``, each chunk goes when the pacer lets it."""
    limits = limits or PartnerLimits.for_timeout(timeout_s)
    where = f"partner {who} at {host}:{port}"
    out: dict[str, str] = {}
    try:
        channel = connect(host, port, secret, timeout_s=timeout_s)
    except ReplicationError as exc:
        raise ReplicationError(f"{where} not authenticated: {exc.message}", step=step) from None
    except (OSError, ValueError) as exc:
        raise ReplicationError(f"{where} unreachable: {type(exc).__name__}: {exc}", step=step) from None
    try:
        with channel.sock:
            for name, path, size, crc in files:
                deadline = limits.transfer_deadline(size)
                channel.send_header({"op": "put", "step": step, "name": name, "size": size, "crc32c": crc},
                                    deadline)
                known = digests.get(name) if digests is not None else None
                digest = send_hashed(channel.sock, path, size, crc, deadline=deadline, idle_s=limits.idle_s,
                                     hash_it=known is None, pacer=pacer) or known
                assert digest is not None
                channel.send_header({"op": "put-end", "digest": digest}, deadline)
                reply = channel.recv_header(time.monotonic() + limits.idle_s)
                if not reply.get("ok"):
                    raise ReplicationError(f"{where} refused {name}: {reply.get('error')}", step=step)
                out[name] = digest
    except ReplicationError as exc:
        raise ReplicationError(exc.message if exc.message.startswith(where) else f"{where}: {exc.message}",
                               step=step) from None
    except (OSError, ValueError) as exc:
        raise ReplicationError(f"{where} unreachable: {type(exc).__name__}: {exc}", step=step) from None
    return out


def fetch_verified(host: str, port: int, step: int, name: str, dest_path: str, *, expected_digest: str | None,
                   expected_size: int, secret: bytes, timeout_s: float, limits: PartnerLimits | None = None) -> None:
    """Fetch ``name`` of ``step`` from the partner server at ``host:port`` into ``dest_path``: streamed to a
    temporary file while hashed, renamed into place only when it is ``expected_size`` bytes with the digest
    ``expected_digest`` (the durable record's). ChecksumError when it is not (nothing is left behind; a copy
    without a recorded digest is refused before connecting), NotFoundError when the server does not hold it,
    ReplicationError when it cannot be reached or authenticated."""
    if expected_digest is None:
        check_digest("", None, what=name, step=step)
    limits = limits or PartnerLimits.for_timeout(timeout_s)
    try:
        channel = connect(host, port, secret, timeout_s=timeout_s)
        with channel.sock:
            channel.send_header({"op": "get", "step": step, "name": name}, time.monotonic() + limits.idle_s)
            reply = channel.recv_header(time.monotonic() + limits.idle_s)
            if not reply.get("ok"):
                raise NotFoundError(f"{host}:{port} does not hold {name}", step=step)
            size = reply.get("size")
            if size != expected_size:  # refused before a byte is written: a lying server cannot fill the disk
                raise ChecksumError(f"{name}: {host}:{port} offers {size} bytes, the record says {expected_size}",
                                    step=step, path=name)
            failed: list[CkptError] = []

            def accept(digest: str, crc: str) -> bool:
                try:
                    check_digest(digest, expected_digest, what=f"{name} from {host}:{port}", step=step)
                except ChecksumError as exc:
                    failed.append(exc)
                return not failed

            receive_to_file(channel.sock, dest_path, size, deadline=limits.transfer_deadline(size),
                            idle_s=limits.idle_s, accept=accept)
            if failed:
                raise failed[0]
    except CkptError:
        raise
    except (OSError, ConnectionError, ValueError) as exc:
        raise ReplicationError(f"{name} from {host}:{port}: {type(exc).__name__}: {exc}", step=step) from None
