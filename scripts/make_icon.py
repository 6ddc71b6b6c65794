"""Draw the plugin's listing icon (.claude-plugin/icon.png, 512x512) with numpy and zlib only.

Rising throughput bars on a dark tile; the last (the shipped recipe) in amber over a dashed band.
Run: python scripts/make_icon.py
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

SIZE = 512
OUT = Path(__file__).resolve().parents[1] / ".claude-plugin" / "icon.png"


def png(rgb: np.ndarray) -> bytes:
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def draw() -> np.ndarray:
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    img = np.zeros((SIZE, SIZE, 3), dtype=np.float64)
    t = y / SIZE
    img[...] = np.stack([18 + 10 * t, 26 + 14 * t, 48 + 22 * t], axis=-1)  # navy, lighter towards the bottom
    floor = 420
    heights = [120, 165, 150, 215, 300]
    colors = [(64, 178, 196)] * 4 + [(244, 176, 62)]
    left, width, gap = 86, 56, 17
    for i, (hgt, col) in enumerate(zip(heights, colors, strict=True)):
        x0 = left + i * (width + gap)
        img[floor - hgt : floor, x0 : x0 + width] = col
    band = 230  # the noise band the winner must clear, dashed
    dash = ((x // 14) % 2 == 0) & (np.abs(y - (floor - band)) <= 2) & (x > 70) & (x < 442)
    img[dash] = (235, 240, 245)
    img[floor : floor + 6, 70:442] = (235, 240, 245)
    return np.clip(img, 0, 255).astype(np.uint8)


if __name__ == "__main__":
    OUT.write_bytes(png(draw()))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
