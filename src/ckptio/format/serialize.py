"""The bytes of one tensor item in a data file: exactly what ``torch.save(tensor)`` produces, without copying.

DCP's readers ``torch.load`` each item's byte range, so every tensor is stored in torch.save's zip format. Run
naively, ``torch.save`` copies the tensor into a buffer (and computes a zip CRC32 over it) before the writer copies
it again into the file: on a 2-core host that is a second full pass over every byte, stealing CPU from training.

With the zip CRC turned off (ckptio checks each file with crc32c instead), the only bytes of a ``torch.save`` blob
that depend on the data are the data themselves. So the first time a (dtype, shape) is seen, the writer serializes
it for real, locates the data record inside the zip, and keeps the framing before and after it; from then on an
item is ``[prefix, <slot bytes>, suffix]`` — a zero-copy view of the staging slot between two small byte strings.

This module runs in the writer process only (it changes a process-wide torch setting).
"""

from __future__ import annotations

import io
import struct
import zipfile

import torch

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # the zip local file header (PKZIP APPNOTE 4.3.7)


def disable_zip_crc() -> bool:
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
    name_len, extra_len = header[-2], header[-1]
    return records[0].header_offset + _LOCAL_HEADER.size + name_len + extra_len


class TensorFramer:
    """Caches torch.save framing per (dtype, shape) and frames slot bytes with it."""

    def __init__(self) -> None:
        self.splice = disable_zip_crc()
        self._framing: dict[tuple[str, tuple[int, ...]], tuple[bytes, bytes] | None] = {}

    def frame(self, tensor: torch.Tensor, raw: memoryview) -> list[bytes | memoryview]:
        """The torch.save bytes of ``tensor`` (whose raw bytes are ``raw``), as a list of buffers."""
        key = (str(tensor.dtype), tuple(tensor.shape))
        framing = self._framing.get(key) if self.splice and raw.nbytes else None
        if framing is not None:
            return [framing[0], raw, framing[1]]
        out = io.BytesIO()
        torch.save(tensor, out)
        blob = out.getvalue()
        if self.splice and raw.nbytes and key not in self._framing:
            offset = _data_offset(blob, raw.nbytes)
            ok = offset is not None and blob[offset : offset + raw.nbytes] == raw
            # A layout we do not recognise is remembered as None: that shape always takes the slow, safe path.
            self._framing[key] = (blob[:offset], blob[offset + raw.nbytes :]) if ok and offset is not None else None
        return [blob]
