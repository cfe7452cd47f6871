"""S3 flush throughput: ckptio's S3Storage vs boto3 ``upload_fileobj`` and ``s5cmd cp`` on one local server.

All three upload the same bytes to the same moto server started by this script (its own process,
127.0.0.1), so the server bounds the absolute numbers and only the ratios mean something. After one warm-up
each, the uploaders take turns, rep by rep (the order rotated each rep), so a change of load on a shared
host falls on all of them alike; median of ``--reps`` with the range. Beside each rate: the client's CPU and
the server's CPU per GiB sent (on a small host they share the cores, so a client's CPU is the server's loss).
Also counts objects and requests per rank for 2,000 tiny tensors coalesced into one file.

    .venv/bin/python bench/bench_s3_flush.py --mib 256 --files 2 --reps 3
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import start_moto

MiB = 1 << 20


def _process_cpu(pid: int) -> float:
    """CPU-seconds (user + system) of a live process, from /proc (the moto server)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client_cpu() -> float:
    """CPU-seconds of this process and its finished children (s5cmd runs as one)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def interleaved_rates(
    uploaders: dict[str, Callable[[int], None]], nbytes: int, reps: int, server_pid: int
) -> dict[str, float]:
    """Median MiB/s of each uploader, reps taken in turns; prints each with its range and CPU per GiB."""
    for run in uploaders.values():
        run(-1)  # warm-up: clients, connection pools, server-side bucket state
    names = list(uploaders)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            client0, server0, start = _client_cpu(), _process_cpu(server_pid), time.perf_counter()
            uploaders[name](rep)
            times[name].append(time.perf_counter() - start)
            cpu[name].append((_client_cpu() - client0, _process_cpu(server_pid) - server0))
    gib = nbytes / (1 << 30)
    rates = {}
    for name in names:
        each = sorted(nbytes / t / MiB for t in times[name])
        rates[name] = statistics.median(each)
        client = statistics.median(c for c, _ in cpu[name]) / gib
        server = statistics.median(s for _, s in cpu[name]) / gib
        print(f"{name:<24} {rates[name]:7.1f} MiB/s [{each[0]:.0f}-{each[-1]:.0f}]   "
              f"client {client:5.2f} CPU-s/GiB   server {server:5.2f} CPU-s/GiB")
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of each file, MiB")
    parser.add_argument("--files", type=int, default=2, help="files per flush (a rank's data files)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    import boto3
    from boto3.s3.transfer import TransferConfig

    from ckptio.storage.s3.s3_storage import S3Storage

    server, url = start_moto()
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    workdir = Path(tempfile.mkdtemp(prefix="ckptio-bench-s3-"))
    paths = []
    for i in range(args.files):
        path = workdir / f"__{i}_0.distcp"
        path.write_bytes(os.urandom(args.mib * MiB))
        paths.append(path)
    payloads = [p.read_bytes() for p in paths]
    # Written back now, not during the first uploader's reps (moto spills every part to temporary files too).
    os.sync()
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

    uploaders = {
        "ckptio put (buffers)": ckptio_put,
        "ckptio put_file": ckptio_put_file,
        "boto3 upload_fileobj": boto3_upload,
    }
    if os.path.exists(s5cmd):
        uploaders["s5cmd cp"] = s5cmd_cp
    obstore_put = _obstore_uploader(url, paths, args.concurrency)
    if obstore_put is not None:  # the alternative client considered for S3Storage (not a dependency)
        uploaders["obstore put"] = obstore_put
    rates = interleaved_rates(uploaders, nbytes, args.reps, server.pid)

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
    best = max(rates["boto3 upload_fileobj"], rates.get("s5cmd cp", 0.0))
    ratios += [
        f"put/best={rates['ckptio put (buffers)'] / best:.2f}",
        f"put_file/best={rates['ckptio put_file'] / best:.2f}",
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

    from ckptio.storage.s3.s3_storage import S3Storage

    assert isinstance(store, S3Storage)
    tensors = [np.full(1024, i, dtype=np.float32) for i in range(2000)]
    before = store.stats["requests"]
    store.put("tiny/step-1/__0_0.distcp", [memoryview(t) for t in tensors])
    requests = store.stats["requests"] - before
    return sum(1 for _ in store.list("tiny/")), requests


if __name__ == "__main__":
    sys.exit(main())
