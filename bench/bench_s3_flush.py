"""S3 flush throughput: ckptio's S3Storage vs boto3 ``upload_fileobj`` and ``s5cmd cp`` on one local server.

All three upload the same bytes to the same moto server started by this script (its own process,
127.0.0.1), so the server bounds the absolute numbers and only the ratios mean something. Median of
``--reps`` after one warm-up. Also counts objects and requests per rank for 2,000 tiny tensors coalesced
into one file.

    .venv/bin/python bench/bench_s3_flush.py --mib 256 --files 2 --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MiB = 1 << 20


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """moto in its own process: a server sharing this process's GIL would slow the Python clients only."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    moto = Path(sys.executable).parent / "moto_server"
    server = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=url,
    )
    return server, url


def median_rate(label: str, nbytes: int, run: Callable[[int], None], reps: int) -> float:
    run(-1)  # warm-up: clients, connection pools, server-side bucket state
    times = []
    for rep in range(reps):
        start = time.perf_counter()
        run(rep)
        times.append(time.perf_counter() - start)
    rate = nbytes / statistics.median(times) / MiB
    print(f"{label:<28} {rate:8.1f} MiB/s   (median of {reps}: {statistics.median(times):.3f} s)")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of each file, MiB")
    parser.add_argument("--files", type=int, default=2, help="files per flush (a rank's data files)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    import boto3
    from boto3.s3.transfer import TransferConfig

    from ckptio.storage.s3 import S3Storage

    server, url = start_server()
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    workdir = Path(tempfile.mkdtemp(prefix="ckptio-bench-s3-"))
    paths = []
    for i in range(args.files):
        path = workdir / f"__{i}_0.distcp"
        path.write_bytes(os.urandom(args.mib * MiB))
        paths.append(path)
    payloads = [p.read_bytes() for p in paths]
    nbytes = args.mib * MiB * args.files
    print(f"server {url}; {args.files} file(s) x {args.mib} MiB; concurrency {args.concurrency}")

    store = S3Storage("bench", "ckptio", max_concurrency=args.concurrency)
    transfer = TransferConfig(max_concurrency=args.concurrency, multipart_chunksize=16 * MiB)

    def ckptio_put(rep: int) -> None:
        for i, data in enumerate(payloads):
            store.put(f"r{rep}/__{i}_0.distcp", memoryview(data))

    def ckptio_put_file(rep: int) -> None:
        for i, path in enumerate(paths):
            store.put_file(f"f{rep}/__{i}_0.distcp", str(path))

    def boto3_upload(rep: int) -> None:
        for i, path in enumerate(paths):
            with open(path, "rb") as f:
                client.upload_fileobj(f, "bench", f"boto/{rep}/__{i}_0.distcp", Config=transfer)

    s5cmd = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")

    def s5cmd_cp(rep: int) -> None:
        subprocess.run(
            [
                s5cmd,
                "--endpoint-url",
                url,
                "cp",
                "--concurrency",
                str(args.concurrency),
                f"{workdir}/*",
                f"s3://bench/s5cmd/{rep}/",
            ],
            check=True,
            capture_output=True,
        )

    rates = {
        "ckptio put (buffers)": median_rate("ckptio put (buffers)", nbytes, ckptio_put, args.reps),
        "ckptio put_file": median_rate("ckptio put_file", nbytes, ckptio_put_file, args.reps),
        "boto3 upload_fileobj": median_rate("boto3 upload_fileobj", nbytes, boto3_upload, args.reps),
    }
    if os.path.exists(s5cmd):
        rates["s5cmd cp"] = median_rate("s5cmd cp", nbytes, s5cmd_cp, args.reps)
    obstore_put = _obstore_uploader(url, paths, args.concurrency)
    if obstore_put is not None:  # the alternative client considered for S3Storage (not a dependency)
        rates["obstore put"] = median_rate("obstore put (file)", nbytes, obstore_put, args.reps)

    objects, requests = tiny_tensor_layout(store)
    print(f"2,000 tiny tensors coalesced: {objects} object(s), {requests} request(s) per rank for the data")
    ratios = [
        f"put/boto3={rates['ckptio put (buffers)'] / rates['boto3 upload_fileobj']:.2f}",
        f"put_file/boto3={rates['ckptio put_file'] / rates['boto3 upload_fileobj']:.2f}",
    ]
    if "s5cmd cp" in rates:
        ratios += [
            f"put/s5cmd={rates['ckptio put (buffers)'] / rates['s5cmd cp']:.2f}",
            f"put_file/s5cmd={rates['ckptio put_file'] / rates['s5cmd cp']:.2f}",
        ]
    if "obstore put" in rates:
        ratios.append(f"put_file/obstore={rates['ckptio put_file'] / rates['obstore put']:.2f}")
    print("RATIOS " + " ".join(ratios))
    shutil.rmtree(workdir)
    server.terminate()
    server.wait()
    return 0


def _obstore_uploader(url: str, paths: list[Path], concurrency: int) -> Callable[[int], None] | None:
    """obstore (Rust object_store) uploading the same files, when it is installed (pip install obstore)."""
    try:
        import obstore
        from obstore.store import S3Store
    except ImportError:
        print("obstore not installed: skipping its comparison")
        return None
    store = S3Store("bench", endpoint=url, region="us-east-1", access_key_id="bench",
                    secret_access_key="bench", client_options={"allow_http": True})

    def put(rep: int) -> None:
        for i, path in enumerate(paths):
            with open(path, "rb") as f:
                obstore.put(store, f"obstore/{rep}/__{i}_0.distcp", f, chunk_size=16 * MiB,
                            max_concurrency=concurrency)

    return put


def tiny_tensor_layout(store: object) -> tuple[int, int]:
    """2,000 tensors of 4 KiB written the way the engine does: coalesced views in one data object."""
    import numpy as np

    from ckptio.storage.s3 import S3Storage

    assert isinstance(store, S3Storage)
    tensors = [np.full(1024, i, dtype=np.float32) for i in range(2000)]
    before = store.stats["requests"]
    store.put("tiny/step-1/__0_0.distcp", [memoryview(t) for t in tensors])
    requests = store.stats["requests"] - before
    return sum(1 for _ in store.list("tiny/")), requests


if __name__ == "__main__":
    sys.exit(main())
