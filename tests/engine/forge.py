"""What an attacker does to a data file that only carries a crc32c: change values, keep size and crc32c.

crc32c is linear over GF(2): flipping a fixed set of bits changes the crc by a fixed amount, whatever the rest of
the file holds. So after any change, 4 bytes chosen by solving a 32x32 system restore the original crc32c.
"""

from __future__ import annotations

import struct

import crc32c


def forge_floats(data: bytes, at: int, *, count: int = 16, value: float = 1e6) -> bytes:
    """``data`` with ``count`` float32 values from byte ``at`` set to ``value``, and the next 4 bytes adjusted so
    that the size and the crc32c are those of ``data``."""
    forged = bytearray(data)
    forged[at:at + 4 * count] = struct.pack(f"<{count}f", *[value] * count)
    return fix_crc(data, forged, at + 4 * count)


def fix_crc(original: bytes, forged: bytearray, fix_at: int) -> bytes:
    """Adjust ``forged[fix_at:fix_at + 4]`` so that crc32c(forged) == crc32c(original)."""
    target = crc32c.crc32c(original) ^ crc32c.crc32c(bytes(forged))
    zero = bytes(len(forged))
    base = crc32c.crc32c(zero)
    pivots: dict[int, tuple[int, int]] = {}  # highest bit -> (crc change, the bits flipped for it)
    for i in range(32):
        e = bytearray(zero)
        e[fix_at + i // 8] ^= 1 << (i % 8)
        col, combo = crc32c.crc32c(bytes(e)) ^ base, 1 << i
        for bit, (pcol, pcombo) in sorted(pivots.items(), reverse=True):
            if col >> bit & 1:
                col, combo = col ^ pcol, combo ^ pcombo
        if col:
            pivots[col.bit_length() - 1] = (col, combo)
    solution, rest = 0, target
    for bit, (pcol, pcombo) in sorted(pivots.items(), reverse=True):
        if rest >> bit & 1:
            rest, solution = rest ^ pcol, solution ^ pcombo
    assert rest == 0, "32 consecutive bits always reach every crc32c value"
    for i in range(32):
        if solution >> i & 1:
            forged[fix_at + i // 8] ^= 1 << (i % 8)
    out = bytes(forged)
    assert crc32c.crc32c(out) == crc32c.crc32c(original) and len(out) == len(original) and out != original
    return out
