"""How an :class:`~.s3_storage.S3Storage` talks to its bucket: its options, and which failures are worth a retry.

Owns :class:`S3Options` (validated on construction), the boto3 client they describe (one boto3 session per
profile and process), and the classification of S3 errors into transient (retried with backoff) and permanent
(raised at once). It must never send a request itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

from ckptio._finite import reject_non_finite
from ckptio.errors import ConfigError
from ckptio.storage.s3.parts import MAX_PART, MIN_PART, MiB

SINGLE_PUT_MAX = 5 << 30
_SESSIONS: dict[str | None, Any] = {}
_SESSIONS_LOCK = threading.Lock()
_RETRYABLE_STATUS = frozenset({500, 502, 503, 504, 409})
_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "ConditionalRequestConflict",
        "RequestTimeTooSkewed",
        "OperationAborted",
        # The body S3 received does not match the checksum (or signed SHA-256) we sent: corrupted in flight.
        # Each attempt re-sends it from memory or the file, so a retry is worth it; a body whose bytes changed
        # under the upload fails every attempt and raises.
        "BadDigest",
        "XAmzContentSHA256Mismatch",
    }
)


@dataclass(kw_only=True, slots=True)
class S3Options:
    """How an :class:`S3Storage` talks to its bucket. Unset values come from the standard AWS chain."""

    endpoint_url: str | None = None
    """S3 endpoint (MinIO, moto, a VPC endpoint). None: ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, AWS."""

    region: str | None = None
    """Signing region of the client. None: ``AWS_REGION``/``AWS_DEFAULT_REGION``/profile. Not the residency
    region: that is the bucket's own region, read with HeadBucket (:attr:`S3Storage.region`)."""

    profile: str | None = None
    """Named profile from ``~/.aws/config``; None uses the default chain (env, profile, instance role)."""

    part_size: int | None = None
    """Multipart part size in bytes. None picks 16 MiB below 2 GiB and 64 MiB above; either way it is raised
    so an object needs at most 10,000 parts and never goes below S3's 5 MiB minimum."""

    read_part_size: int = 128 * MiB
    """Bytes per ranged GET of a restore: a range up to this size is one request, a larger one is fetched in parts
    of this size concurrently, and adjacent ranges a rank reads are merged up to it. Fewer, larger requests cost
    less per byte on every S3 implementation (the request overhead is paid once per part; some servers, moto among
    them, read the whole object for every ranged GET); throughput comes from the requests in flight."""

    multipart_threshold: int = 16 * MiB
    """Objects up to this size go in one PUT; larger ones as concurrent multipart parts."""

    max_concurrency: int = 8
    """Concurrent requests of one put/put_file/get_many call (parts or objects)."""

    max_attempts: int = 8
    """Attempts per request before a transient failure (503 SlowDown, 500, timeout, dropped link) raises."""

    retry_base_s: float = 0.1
    """First backoff; attempt n sleeps a uniform random time in [0, min(retry_cap_s, retry_base_s · 2ⁿ)]."""

    retry_cap_s: float = 10.0
    """Upper bound of one backoff sleep."""

    connect_timeout_s: float = 10.0
    """TCP connect timeout of one request."""

    read_timeout_s: float = 120.0
    """Socket read timeout of one request (a stalled part is retried after this)."""

    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """Bucket addressing: ``path`` for servers without wildcard DNS (botocore picks it for IP endpoints)."""

    sign_payload: bool = False
    """SHA-256 every request body into its SigV4 signature. Off, a body goes out as ``UNSIGNED-PAYLOAD`` with
    its CRC32C, which S3 checks before it stores the bytes: integrity for one hardware CRC pass instead of the
    SHA-256 pass botocore makes over plain http. What off gives up, on plain http only, is SigV4's
    authentication of the body, which reads over plain http never had. On: for a store that refuses unsigned
    payloads."""

    hash_prefix: bool = False
    """Ask the engine to put per-rank data under a short hash directory (:meth:`S3Storage.data_key`): spreads
    the burst over S3 partitions."""

    def __post_init__(self) -> None:
        reject_non_finite(self)  # first: NaN passes every comparison below
        if self.part_size is not None and not MIN_PART <= self.part_size <= MAX_PART:
            raise ConfigError(f"part_size must be within 5 MiB..5 GiB, got {self.part_size}")
        if not MiB <= self.read_part_size <= MAX_PART:
            raise ConfigError(f"read_part_size must be within 1 MiB..5 GiB, got {self.read_part_size}")
        if not 1 <= self.multipart_threshold <= SINGLE_PUT_MAX:
            raise ConfigError(
                f"multipart_threshold must be within 1 B..5 GiB, got {self.multipart_threshold}"
            )
        if self.max_concurrency < 1 or self.max_attempts < 1:
            raise ConfigError("max_concurrency and max_attempts must be at least 1")
        if (
            self.retry_base_s < 0
            or self.retry_cap_s < 0
            or self.connect_timeout_s <= 0
            or self.read_timeout_s <= 0
        ):
            raise ConfigError("retry delays must be >= 0 and timeouts > 0")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"addressing_style must be auto, path or virtual, got {self.addressing_style!r}"
            )


def make_client(opts: S3Options) -> Any:
    """A boto3 S3 client for ``opts`` (sends nothing). Retries are switched off: S3Storage retries itself."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("s3:// roots need boto3: pip install 'ckptio[s3]'") from exc
    with _SESSIONS_LOCK:
        # One boto3 session per profile and process: a new one re-parses the S3 service model (~0.3 s).
        session = _SESSIONS.get(opts.profile)
        if session is None:
            session = _SESSIONS[opts.profile] = boto3.session.Session(profile_name=opts.profile)
    # Without our CRC32C (see sends_checksums) the body is signed, as botocore would sign it.
    plain = session._session.get_config_variable("request_checksum_calculation") == "when_required"
    config = Config(
        connect_timeout=opts.connect_timeout_s,
        read_timeout=opts.read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"},  # we retry ourselves: see ckptio.storage.s3.s3_storage
        max_pool_connections=max(10, 2 * opts.max_concurrency),
        # Explicit either way: botocore signs the body of a request that carries our own checksum header even
        # over https (it looks only for Content-MD5 or a checksum it computed itself).
        s3={"addressing_style": opts.addressing_style, "payload_signing_enabled": opts.sign_payload or plain},
        tcp_keepalive=True,
    )
    with _SESSIONS_LOCK:  # client creation from a shared session is not thread-safe
        return session.client(
            "s3", endpoint_url=opts.endpoint_url, region_name=opts.region, config=config
        )


def sends_checksums(client: Any) -> bool:
    """Whether uploads carry ckptio's CRC32C: unless the AWS chain sets ``request_checksum_calculation`` to
    ``when_required`` (``AWS_REQUEST_CHECKSUM_CALCULATION``, or the profile), the setting that keeps checksum
    headers away from a store that refuses them; botocore then sends none on uploads either."""
    return bool(client.meta.config.request_checksum_calculation != "when_required")


def status_code(exc: BaseException | None) -> tuple[int | None, str | None]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status, response.get("Error", {}).get("Code")


def is_transient(exc: Exception) -> bool:
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )
    from botocore.exceptions import (
        HTTPClientError,
        IncompleteReadError,
    )

    if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
        return True
    status, code = status_code(exc)
    if code == "PreconditionFailed" or status == 412:
        return False
    return status in _RETRYABLE_STATUS or code in _RETRYABLE_CODES
