"""The embedded moto S3 server: moto on 127.0.0.1, a free port, fake credentials, one private bucket.

moto honours what ckptio relies on (``If-None-Match``/``If-Match`` conditional writes, bucket region, the
public-access block, policy status and ACLs): it is the store everything is expected to work on. Its sibling
:mod:`ckptio.testing.s3rver_s3` runs s3rver, which ignores conditional writes. Each module is named after the server
it runs (``<server>_s3``), so the two cannot be mistaken for one another the way ``s3server``/``s3rver`` were.

``ckptio demo --store s3`` uses it, and so does the test session's ``s3_endpoint`` fixture. The credentials are
placed in this process's environment for the duration, so the rank processes (and their writers) inherit them; the
previous values come back afterwards. This module must never talk to a real AWS endpoint: everything it sets points
at the local server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from ckptio.errors import ConfigError

BUCKET = "ckptio-demo"
_FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "demo",
    "AWS_SECRET_ACCESS_KEY": "demo",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Keep the user's ~/.aws out of the demo: it must not pick a real profile or endpoint.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def s3_missing_reason() -> str | None:
    """Why ``--store s3`` cannot run here, or None when it can."""
    for module, what in (
        ("ckptio.storage.s3.s3_storage", "ckptio's S3 backend"),
        ("boto3", "boto3 (pip install 'ckptio[s3]')"),
        ("moto", "moto[server] (pip install 'ckptio[dev]')"),
    ):
        if importlib.util.find_spec(module) is None:
            return f"--store s3 needs {what}, which is not installed"
    return None


class _ConditionalWritesOneAtATime:
    """WSGI middleware: conditional writes (``If-None-Match``/``If-Match`` on a PUT or a multipart completion) one
    at a time. moto checks the precondition, then writes, with nothing between the two (``moto/s3/responses.py``):
    under load two creators of one key both passed the check and both "won" (seen once in the suite). S3 decides a
    conditional write atomically; so does moto behind this."""

    def __init__(self, app: Any) -> None:
        self.app, self.lock = app, threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        conditional = "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ
        if environ.get("REQUEST_METHOD") not in ("PUT", "POST") or not conditional:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))  # the whole response inside the lock


def _serve() -> Any:
    """moto's S3 app on 127.0.0.1 and a free port, a thread per request, served from a daemon thread."""
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = _ConditionalWritesOneAtATime(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, name="ckptio-moto", daemon=True).start()
    return server


@contextlib.contextmanager
def embedded_s3() -> Iterator[str]:
    """Start the server, create the bucket; yields the endpoint URL."""
    reason = s3_missing_reason()
    if reason:
        raise ConfigError(reason)
    import boto3

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = _serve()
    host, port = server.server_address[:2]
    endpoint = f"http://{host}:{port}"
    saved = {key: os.environ.get(key) for key in [*_FAKE_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update(_FAKE_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.shutdown()
        server.server_close()
