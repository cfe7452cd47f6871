"""The bytes of one tensor item in a data file: exactly what ``torch.save(tensor)`` produces, without copying.

DCP's readers ``torch.load`` each item's byte range, so every tensor is stored in torch.save's zip format. Run
naively, ``torch.save`` copies the tensor into a buffer (and computes a zip CRC32 over it) before the writer copies
it again into the file: on a 2-core host that is a second full pass over every byte, stealing CPU from training.

With the zip CRC turned off (ckptio checks each file with crc32c instead), the only bytes of a ``torch.save`` blob
that depend on the data are the data themselves. ``format.torchsave`` writes the framing before and after them
from the dtype and shape alone, so an item is ``[prefix, <slot bytes>, suffix]`` — a zero-copy view of the staging
slot between two small byte strings — and the writer process never imports torch.

What ``format.torchsave`` does not cover (a dtype it does not list, a tensor of 4 GiB or more) takes torch.save
itself: torch is imported then, in this process only, and its zip CRC is turned off process-wide.
"""

from __future__ import annotations

import io
import struct
import zipfile
from typing import Any

from ckptio.format import torchsave

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # the zip local file header (PKZIP APPNOTE 4.3.7)


def disable_zip_crc(torch: Any) -> bool:
    """Turn off torch.save's per-record CRC32 in this process; False where torch cannot."""
    setter = getattr(torch.serialization, "set_crc32_options", None)
    if setter is None:
        return False
    setter(False)
    return True


def _data_offset(blob: bytes, nbytes: int) -> int | None:
    """Offset of the tensor's raw bytes inside a torch.save blob, or None if the layout is not the expected one."""
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        records = [i for i in zf.infolist() if i.filename.endswith("/data/0")]
    if len(records) != 1 or records[0].file_size != nbytes or records[0].compress_type != zipfile.ZIP_STORED:
        return None
    header = _LOCAL_HEADER.unpack_from(blob, records[0].header_offset)
    name_len, extra_len = int(header[-2]), int(header[-1])
    return records[0].header_offset + _LOCAL_HEADER.size + name_len + extra_len


class TensorFramer:
    """Frames slot bytes as torch.save output, caching the framing per (dtype, shape)."""

    def __init__(self) -> None:
        self._framing: dict[tuple[str, tuple[int, ...]], tuple[bytes, bytes] | None] = {}
        self._torch: Any = None
        self.splice = True
        """False when the torch.save fallback cannot turn off the zip CRC (every such item is then a full copy)."""

    @property
    def torch_imported(self) -> bool:
        """Whether some item needed torch.save itself (this process then holds torch)."""
        return self._torch is not None

    def frame(self, dtype: str, shape: tuple[int, ...], raw: memoryview) -> list[bytes | memoryview]:
        """The torch.save bytes of the contiguous ``dtype``/``shape`` tensor whose bytes are ``raw``."""
        return self.frame_item(dtype, shape, raw)[0]

    def frame_item(self, dtype: str, shape: tuple[int, ...],
                   raw: memoryview) -> tuple[list[bytes | memoryview], int | None]:
        """:meth:`frame`, and where ``raw`` starts in those bytes (None when torch.save's layout was not the
        expected one). Readers use the offset to read a tensor's bytes straight into their target."""
        key = (dtype, shape)
        if key not in self._framing:
            framing = torchsave.framing(dtype, shape)
            expected = raw.nbytes == torchsave.nbytes(dtype, shape) if framing is not None else False
            self._framing[key] = framing if expected else None
        framing = self._framing[key]
        if framing is not None:
            return [framing[0], raw, framing[1]], len(framing[0])
        return self._frame_with_torch(key, raw)

    def _frame_with_torch(self, key: tuple[str, tuple[int, ...]],
                          raw: memoryview) -> tuple[list[bytes | memoryview], int | None]:
        """torch.save itself; the first blob of a key also yields a reusable framing when its layout is known."""
        if self._torch is None:
            import torch  # only here: a writer that never reaches this line never loads torch

            self.splice = disable_zip_crc(torch)
            self._torch = torch
        torch = self._torch
        dtype, shape = key
        count = raw.nbytes
        flat = torch.frombuffer(raw, dtype=torch.uint8, count=count) if count else torch.empty(0, dtype=torch.uint8)
        tensor = flat.view(getattr(torch, dtype)).view(shape)
        out = io.BytesIO()
        torch.save(tensor, out)
        blob = out.getvalue()
        offset = _data_offset(blob, count) if count else None
        if offset is not None and blob[offset : offset + count] != raw:
            offset = None
        if self.splice and offset is not None:
            self._framing[key] = (blob[:offset], blob[offset + count :])
        # Stored uncompressed, the data lies at ``offset`` even when the zip CRC could not be turned off.
        return [blob], offset
