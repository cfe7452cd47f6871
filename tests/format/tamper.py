"""What someone who can write to a checkpoint root can do to it: rewrite ``.metadata``, a data file or a manifest,
and fix the checksums so that only the trust model and the containment checks stand in the way.

The tests' own reads use plain ``pickle`` on bytes the test itself wrote (trusted here, never in ckptio)."""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
from typing import Any

import torch

from ckptio.format import checksum


class MakeDirPayload:
    """Unpickling it runs ``os.makedirs(marker)``: the marker directory appearing proves code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.makedirs, (self.marker,))


def step_path(root: str, step: int, *parts: str) -> str:
    return os.path.join(root, f"step-{step:08d}", *parts)


def data_file(root: str, step: int) -> str:
    (path,) = glob.glob(step_path(root, step, "__0_0-*.distcp"))
    return path


def load_manifest(root: str, step: int) -> dict[str, Any]:
    with open(step_path(root, step, "manifest.json")) as f:
        return json.load(f)


def save_manifest(root: str, step: int, body: dict[str, Any]) -> None:
    with open(step_path(root, step, "manifest.json"), "w") as f:
        json.dump(body, f)


def load_metadata(root: str, step: int) -> Any:
    with open(step_path(root, step, ".metadata"), "rb") as f:
        return pickle.loads(f.read())  # the test wrote (or trusts) this file


def write_metadata(root: str, step: int, raw: bytes, *, crc: str | None = "fix") -> None:
    """Replace ``.metadata``; ``crc="fix"`` records its real checksum in the manifest, ``""`` blanks it."""
    with open(step_path(root, step, ".metadata"), "wb") as f:
        f.write(raw)
    body = load_manifest(root, step)
    body["metadata_crc32c"] = checksum([raw]) if crc == "fix" else crc
    save_manifest(root, step, body)


def replace_value(root: str, step: int, fqn: str, value: Any) -> None:
    """Point the non-tensor item ``fqn`` at a new ``torch.save`` blob appended to the data file, and fix every
    checksum (data file and ``.metadata``) in the manifest."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    blob = io.BytesIO()
    torch.save(value, blob)
    path = data_file(root, step)
    offset = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(blob.getvalue())
    metadata = load_metadata(root, step)
    info = metadata.storage_data[MetadataIndex(fqn)]
    info.offset, info.length = offset, len(blob.getvalue())
    with open(path, "rb") as f:
        data = f.read()
    body = load_manifest(root, step)
    rec = body["files"][os.path.basename(path)]
    rec["size"], rec["crc32c"] = len(data), checksum([data])
    save_manifest(root, step, body)
    write_metadata(root, step, pickle.dumps(metadata))
