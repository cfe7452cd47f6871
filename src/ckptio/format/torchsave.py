"""torch.save's zip framing of one contiguous CPU tensor, written without importing torch.

What ``torch.save(tensor, buffer)`` emits with the zip CRC turned off (``set_crc32_options(False)``) depends on the
data only through the data bytes themselves: everything else is a function of (dtype, shape). This module writes
that framing — the bytes before and after the raw data — from the dtype's name and the shape alone, so a writer
process can frame a staged tensor without paying torch's import (seconds) and resident memory (hundreds of MiB).

The layout, as torch 2.x writes it for an in-memory buffer (miniz, zip64 end records always present):

- records ``archive/data.pkl``, ``.format_version``, ``.storage_alignment``, ``byteorder``, ``data/0``,
  ``version``, ``.data/serialization_id``, each a stored (uncompressed) local entry whose data starts on a
  64-byte boundary (an ``FB`` extra field of ``Z`` padding), CRC 0, sizes in a data descriptor (none for an empty
  record);
- a central directory, a zip64 end record and locator, and the classic end record.

``data.pkl`` is the protocol-2 pickle of ``torch._utils._rebuild_tensor_v2(storage, 0, shape, stride, False,
OrderedDict())`` (``_v3`` plus the dtype for dtypes without a typed storage class), the storage being the persistent
id ``('storage', <storage class>, '0', 'cpu', numel)``. The tests compare these bytes with torch.save's for every
dtype listed here, so a torch release that changes its layout fails them rather than writing something else.

It never imports torch; it returns ``None`` for what it does not cover (an unknown dtype, a record too large for
32-bit zip fields, a big-endian host) and the caller then uses torch.save itself.
"""

from __future__ import annotations

import math
import struct
import sys

ALIGNMENT = 64
# Records at or past 4 GiB need zip64 extras in the local headers: left to torch.save.
_ZIP32_LIMIT = 0xFFFFFFFF - (1 << 20)
# torch.save's ``.data/serialization_id``: 20 digits of a hash over the record names (a fixed set, so a constant)
# then 20 digits of a hash_combine over each data descriptor's CRC (all zero here, so it depends only on how many
# records have a descriptor: the empty data record has none).
_NAMES_HASH = b"15728199511854643026"
_U64 = (1 << 64) - 1


def serialization_id(descriptors: int) -> bytes:
    """The id torch's PyTorchStreamWriter derives for a CRC-less archive with ``descriptors`` data descriptors."""
    seed = 0
    for _ in range(descriptors):  # c10::hash_combine(seed, crc=0)
        seed ^= (0x9E3779B9 + ((seed << 6) & _U64) + (seed >> 2)) & _U64
    return _NAMES_HASH + b"%020d" % seed

# dtype name → (storage class global or None for ``_rebuild_tensor_v3`` + UntypedStorage, element size)
DTYPES: dict[str, tuple[str | None, int]] = {
    "bool": ("BoolStorage", 1),
    "uint8": ("ByteStorage", 1),
    "int8": ("CharStorage", 1),
    "int16": ("ShortStorage", 2),
    "int32": ("IntStorage", 4),
    "int64": ("LongStorage", 8),
    "float16": ("HalfStorage", 2),
    "bfloat16": ("BFloat16Storage", 2),
    "float32": ("FloatStorage", 4),
    "float64": ("DoubleStorage", 8),
    "complex64": ("ComplexFloatStorage", 8),
    "complex128": ("ComplexDoubleStorage", 16),
    "uint16": (None, 2),
    "uint32": (None, 4),
    "uint64": (None, 8),
    "float8_e4m3fn": (None, 1),
    "float8_e4m3fnuz": (None, 1),
    "float8_e5m2": (None, 1),
    "float8_e5m2fnuz": (None, 1),
    "float8_e8m0fnu": (None, 1),
}

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header (APPNOTE 4.3.7)
_DESCRIPTOR = struct.Struct("<IIII")  # data descriptor with signature
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory header (4.3.12)
_EOCD64 = struct.Struct("<IQHHIIQQQQ")  # zip64 end of central directory record (4.3.14)
_LOCATOR64 = struct.Struct("<IIQI")  # zip64 end of central directory locator (4.3.15)
_EOCD = struct.Struct("<IHHHHIIH")  # end of central directory record (4.3.16)
_FLAGS = 0x0808  # bit 3: sizes in a data descriptor; bit 11: UTF-8 names
_FLAGS_EMPTY = 0x0800  # miniz writes no descriptor for an empty record


# ---- the pickle (protocol 2, the opcodes CPython's pickler emits for these values) -----------------------------------
class _Pickle:
    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo = 0

    def put(self) -> None:
        self.out += b"q" + bytes([self.memo])  # BINPUT (this pickle never holds 256 memoized values)
        self.memo += 1

    def global_(self, module: str, name: str) -> None:
        self.out += b"c" + f"{module}\n{name}\n".encode()
        self.put()

    def str_(self, s: str) -> None:
        raw = s.encode()
        self.out += b"X" + struct.pack("<I", len(raw)) + raw
        self.put()

    def int_(self, n: int) -> None:
        if 0 <= n <= 0xFF:
            self.out += b"K" + bytes([n])
        elif 0 <= n <= 0xFFFF:
            self.out += b"M" + struct.pack("<H", n)
        elif -(1 << 31) <= n < (1 << 31):
            self.out += b"J" + struct.pack("<i", n)
        else:
            raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)  # pickle.encode_long
            self.out += b"\x8a" + bytes([len(raw)]) + raw

    def int_tuple(self, values: tuple[int, ...]) -> None:
        if not values:
            self.out += b")"  # EMPTY_TUPLE, never memoized
            return
        if len(values) > 3:
            self.out += b"("
        for v in values:
            self.int_(v)
        self.out += b"t" if len(values) > 3 else b"\x85\x86\x87"[len(values) - 1 : len(values)]
        self.put()


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """torch's strides for a contiguous tensor (a zero-sized dimension counts as 1)."""
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def data_pickle(dtype: str, shape: tuple[int, ...]) -> bytes:
    """``archive/data.pkl`` for a contiguous tensor of ``dtype``/``shape`` over its own storage."""
    storage_cls, itemsize = DTYPES[dtype]
    numel = math.prod(shape)
    p = _Pickle()
    p.global_("torch._utils", "_rebuild_tensor_v2" if storage_cls else "_rebuild_tensor_v3")
    p.out += b"(("  # MARK (args) MARK (persistent id)
    p.str_("storage")
    if storage_cls:
        p.global_("torch", storage_cls)
    else:
        p.global_("torch.storage", "UntypedStorage")
    p.str_("0")
    p.str_("cpu")
    p.int_(numel if storage_cls else numel * itemsize)
    p.out += b"t"
    p.put()
    p.out += b"Q"  # BINPERSID
    p.int_(0)  # storage offset
    p.int_tuple(shape)
    p.int_tuple(contiguous_strides(shape))
    p.out += b"\x89"  # requires_grad=False
    p.global_("collections", "OrderedDict")
    p.out += b")R"
    p.put()
    if not storage_cls:
        p.global_("torch", dtype)
    p.out += b"t"
    p.put()
    p.out += b"R"
    p.put()
    p.out += b"."
    return bytes(p.out)


# ---- the zip ---------------------------------------------------------------------------------------------------------
def _local_header(offset: int, name: bytes, size: int) -> bytes:
    start = offset + _LOCAL.size + len(name) + 4
    pad = -start % ALIGNMENT
    extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    flags = _FLAGS if size else _FLAGS_EMPTY
    return _LOCAL.pack(0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0, len(name), len(extra)) + name + extra


def _central(name: bytes, size: int, offset: int) -> bytes:
    flags = _FLAGS if size else _FLAGS_EMPTY
    return _CENTRAL.pack(0x02014B50, 0, 0, flags, 0, 0, 0, 0, size, size, len(name), 0, 0, 0, 0, 0, offset) + name


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """The byte size of a contiguous ``dtype``/``shape`` tensor (``dtype`` one of :data:`DTYPES`)."""
    return math.prod(shape) * DTYPES[dtype][1]


def framing(dtype: str, shape: tuple[int, ...]) -> tuple[bytes, bytes] | None:
    """(prefix, suffix) such that ``prefix + raw + suffix`` is torch.save's output for the contiguous tensor whose
    bytes are ``raw``; None where this module does not reproduce torch.save (the caller falls back to it)."""
    if dtype not in DTYPES or sys.byteorder != "little":
        return None
    size = nbytes(dtype, shape)
    if size >= _ZIP32_LIMIT:
        return None
    records: list[tuple[str, bytes | int]] = [
        ("data.pkl", data_pickle(dtype, shape)),
        (".format_version", b"1"),
        (".storage_alignment", str(ALIGNMENT).encode()),
        ("byteorder", b"little"),
        ("data/0", size),  # the tensor's bytes: not part of the framing
        ("version", b"3\n"),
        # written last, after the id was computed from the 5 or 6 descriptors before it
        (".data/serialization_id", serialization_id(6 if size else 5)),
    ]
    return _zip(records)


def _zip(records: list[tuple[str, bytes | int]]) -> tuple[bytes, bytes]:
    """The archive of ``records`` split around the one whose body is a byte count (the tensor's data)."""
    parts: list[bytearray] = [bytearray()]
    central = bytearray()
    offset = 0
    for rec_name, body in records:
        name = f"archive/{rec_name}".encode()
        size = body if isinstance(body, int) else len(body)
        header = _local_header(offset, name, size)
        central += _central(name, size, offset)
        parts[-1] += header
        if isinstance(body, int):
            parts.append(bytearray())  # the data goes between prefix and suffix
        else:
            parts[-1] += body
        descriptor = _DESCRIPTOR.pack(0x08074B50, 0, size, size) if size else b""
        parts[-1] += descriptor
        offset += len(header) + size + len(descriptor)
    n = len(records)
    eocd64_offset = offset + len(central)
    parts[-1] += (central
                  + _EOCD64.pack(0x06064B50, _EOCD64.size - 12, 0x031E, 0x002D, 0, 0, n, n, len(central), offset)
                  + _LOCATOR64.pack(0x07064B50, 0, eocd64_offset, 1)
                  + _EOCD.pack(0x06054B50, 0, 0, n, n, len(central), offset, 0))
    return bytes(parts[0]), bytes(parts[1])


def zip_crc_problem(blob: bytes | bytearray | memoryview) -> str | None:
    """Why a ``torch.save`` blob fails the CRC-32 its zip records hold, or None.

    torch.save records a CRC-32 for every record of its archive (unless ``set_crc32_options(False)``, as ckptio's
    own framing does: a record whose CRC is 0 is then not checked), and ``torch.load`` never checks them. They are
    the only checksums a plain DCP checkpoint carries, so a restore of one checks them here before it loads an item.
    Stored (uncompressed) records only, as torch.save writes them; the central directory gives each record's place.
    """
    import io
    import zipfile
    import zlib

    view = memoryview(blob).cast("B")
    try:
        archive = zipfile.ZipFile(io.BytesIO(view))  # reads the directory only
        for info in archive.infolist():
            if info.CRC == 0 or info.compress_type != zipfile.ZIP_STORED:
                continue
            start = info.header_offset
            name_len, extra_len = struct.unpack_from("<HH", view, start + 26)
            data = view[start + 30 + name_len + extra_len : start + 30 + name_len + extra_len + info.file_size]
            if len(data) != info.file_size or zlib.crc32(data) != info.CRC:
                return f"record {info.filename} fails its zip CRC-32"
    except (zipfile.BadZipFile, struct.error, ValueError) as exc:
        return f"not a readable torch.save archive ({exc})"
    return None
