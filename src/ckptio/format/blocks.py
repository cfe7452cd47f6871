"""Block checksums: crc32c of each fixed-size block of an item's bytes, so a reader can verify any range it reads.

A file's own crc32c (``FileRecord.crc32c``) can be checked only by reading the whole file. To let a rank read just
the byte ranges it needs, the writer also records, per item, the crc32c of every :data:`BLOCK_SIZE` block of the
item's *checked bytes*: a tensor's raw bytes when the framer knows where they start (``ItemRecord.data_offset``),
the whole item otherwise (pickled objects). Blocks start at the checked bytes' first byte, so block boundaries fall
on element boundaries of every dtype.

Both checksums come from one pass over the data: each block's crc is computed once from zero and folded into the
running file crc with :func:`crc32c_combine` (the GF(2) arithmetic zlib's ``crc32_combine`` uses), so the writer
pays no second pass over its bytes. Small pieces are cheaper to checksum twice than to combine, and are.
No storage access and no processes here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c as _crc32c

from ckptio.storage.base import Buffer

BLOCK_SIZE = 4 << 20
"""Checksum block of new checkpoints: small enough that a resharded rank over-reads little, large enough that a
record holds few entries (8 hex digits per 4 MiB)."""

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
# Below this a second crc pass costs less than the combine's Python arithmetic.
_COMBINE_MIN = 256 << 10
HEX = 8


def _multmodp(a: int, b: int) -> int:
    """a × b modulo the CRC polynomial, both reflected (zlib's multmodp)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    p, table = 1 << 30, []  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return tuple(table)


_X2N = _x2n_table()


@functools.lru_cache(maxsize=1024)
def _shift(nbytes: int) -> int:
    """x^(8·nbytes) modulo the polynomial: the operator that moves a crc past ``nbytes`` bytes."""
    p, k, n = 1 << 31, 3, nbytes
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """crc32c of ``A + B`` from crc32c(A), crc32c(B) and len(B)."""
    return _multmodp(_shift(len2), crc1) ^ crc2 if len2 else crc1


def crc32c(data: Buffer, value: int = 0) -> int:
    return int(_crc32c.crc32c(data, value))


class RunningChecksum:
    """The crc32c of a file built piece by piece, with each piece's block checksums taken on the way."""

    def __init__(self) -> None:
        self.value = 0
        self.size = 0

    def add(self, data: memoryview | bytes) -> None:
        """Bytes no item checksum covers (torch.save framing)."""
        self.value = crc32c(data, self.value)
        self.size += len(data)

    def add_blocks(self, data: memoryview | bytes, block_size: int = BLOCK_SIZE) -> str:
        """Checked bytes: folded into the file crc, and returned as their block checksums (hex, concatenated)."""
        view = memoryview(data).cast("B")
        out = []
        for start in range(0, view.nbytes, block_size):
            piece = view[start : start + block_size]
            if piece.nbytes < _COMBINE_MIN:
                block = crc32c(piece)
                self.value = crc32c(piece, self.value)
            else:
                block = crc32c(piece)
                self.value = crc32c_combine(self.value, block, piece.nbytes)
            self.size += piece.nbytes
            out.append(f"{block:08x}")
        return "".join(out)

    def add_item(self, parts: Sequence[Buffer], start: int, nbytes: int, block_size: int = BLOCK_SIZE) -> str:
        """One item made of ``parts``: its ``nbytes`` checked bytes from ``start`` get block checksums (returned),
        the rest is folded into the file crc only."""
        views = [memoryview(p).cast("B") for p in parts]
        pos, home = 0, None
        for i, view in enumerate(views):  # the checked bytes lie in one part (the slot's, or torch.save's blob)
            if home is None and pos <= start and start + nbytes <= pos + view.nbytes:
                home, lo = i, start - pos
            pos += view.nbytes
        if home is None:  # split across parts: join them (a copy; no framer of ours produces this)
            views, home, lo = [memoryview(b"".join(views))], 0, start
        crcs = ""
        for i, view in enumerate(views):
            if i != home:
                self.add(view)
                continue
            self.add(view[:lo])
            crcs = self.add_blocks(view[lo : lo + nbytes], block_size)
            self.add(view[lo + nbytes :])
        return crcs

    @property
    def hex(self) -> str:
        return f"{self.value:08x}"


def block_count(nbytes: int, block_size: int) -> int:
    return -(-nbytes // block_size) if block_size > 0 else 0


MIN_BLOCK_SIZE = 64 << 10
"""Smallest checksum block a reader accepts. Smaller blocks buy a reader nothing (a reshard over-reads at most one
block at each edge of its range) and cost it a crc call, a record and a plan entry each, so an index of tiny blocks
could make a small tensor's restore spend memory and time without bound."""
MAX_BLOCKS = 1 << 20
"""Most checksum blocks one item may claim (a 4 TiB tensor at the writer's 4 MiB): the reader's plan holds one entry
per block."""


def block_layout_problem(block_size: int, nbytes: int) -> str | None:
    """Why a record's checksum blocks (``block_size`` over ``nbytes`` checked bytes) are refused, or None. Records
    without blocks (``block_size`` 0) have nothing to refuse."""
    if block_size == 0:
        return None
    if block_size < MIN_BLOCK_SIZE:
        return f"checksum blocks of {block_size} bytes, below the minimum of {MIN_BLOCK_SIZE}"
    if block_count(nbytes, block_size) > MAX_BLOCKS:
        return f"{block_count(nbytes, block_size)} checksum blocks, above the bound of {MAX_BLOCKS}"
    return None


@dataclass(frozen=True, slots=True)
class Block:
    """One checksum block, placed in its file: ``length`` bytes at ``offset`` whose crc32c is ``crc`` (hex)."""

    offset: int
    length: int
    crc: str
    what: str
    """The item (fqn) or file the block belongs to, for error messages."""


def split_blocks(start: int, nbytes: int, block_size: int, crcs: str, what: str) -> list[Block]:
    """The blocks of ``nbytes`` checked bytes starting at file offset ``start``."""
    return [Block(start + i * block_size, min(block_size, nbytes - i * block_size), crcs[i * HEX : (i + 1) * HEX],
                  what)
            for i in range(block_count(nbytes, block_size))]
