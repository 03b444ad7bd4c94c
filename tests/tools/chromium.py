"""Headless Debian Chromium screenshots, and a tiny PNG decoder (zlib only, no PIL)."""
from __future__ import annotations

import pathlib
import struct
import subprocess
import tempfile
import zlib

from tools.debian import ensure_binary

FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync',
         '--hide-scrollbars']


def chromium_binary() -> tuple[str | None, str]:
    return ensure_binary('chromium', 'chromium')


def screenshot(binary: str, html_path: pathlib.Path, png_path: pathlib.Path, size: tuple[int, int] = (1280, 1400),
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Render a local HTML file to a PNG (bounded by `timeout`)."""
    with tempfile.TemporaryDirectory(prefix='gpufleet-chromium-') as profile:
        cmd = [binary, *FLAGS, '--user-data-dir=%s' % profile, '--window-size=%d,%d' % size,
               '--screenshot=%s' % png_path, html_path.resolve().as_uri()]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, rows of RGB(A) bytes) for 8-bit RGB/RGBA non-interlaced PNGs."""
    assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
    pos, idat, width = 8, b'', 0
    height = bit_depth = color_type = interlace = 0
    while pos < len(data):
        length, ctype = struct.unpack('>I4s', data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if ctype == b'IHDR':
            width, height, bit_depth, color_type, _compression, _filter, interlace = struct.unpack('>IIBBBBB', chunk)
        elif ctype == b'IDAT':
            idat += chunk
        elif ctype == b'IEND':
            break
    assert bit_depth == 8 and color_type in (2, 6) and interlace == 0, (bit_depth, color_type, interlace)
    bpp = 3 if color_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def colour_counts(width: int, rows: list[bytes], bpp: int) -> dict[tuple[int, int, int], int]:
    counts: dict[tuple[int, int, int], int] = {}
    for row in rows:
        for x in range(width):
            px = (row[x * bpp], row[x * bpp + 1], row[x * bpp + 2])
            counts[px] = counts.get(px, 0) + 1
    return counts
