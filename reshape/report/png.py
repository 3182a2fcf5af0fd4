"""Bar charts as PNG files with the standard library only (zlib), for `reshape report --plot`.

No plotting library is installed, and `reshape report` must work where the proxy runs (no
Chromium there either), so this draws on an RGB pixel grid with a 5x7 bitmap font and writes the
PNG itself. Enough for bars with interval whiskers and labels; nothing more.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GREY: Color = (200, 200, 200)
PALETTE: tuple[Color, ...] = ((70, 110, 190), (230, 130, 40), (60, 160, 90), (190, 60, 60))

# Rows top to bottom, bit 4 the leftmost pixel (the HD44780 character ROM's shapes).
_FONT: dict[str, tuple[int, ...]] = {
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E),
    "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F),
    "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02),
    "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E),
    "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E),
    "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    "A": (0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11),
    "B": (0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E),
    "C": (0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E),
    "D": (0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C),
    "E": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F),
    "F": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10),
    "G": (0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F),
    "H": (0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "I": (0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "J": (0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C),
    "K": (0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11),
    "L": (0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F),
    "M": (0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11),
    "N": (0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11),
    "O": (0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "P": (0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10),
    "Q": (0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D),
    "R": (0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11),
    "S": (0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E),
    "T": (0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04),
    "U": (0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "V": (0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "W": (0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A),
    "X": (0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11),
    "Y": (0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04),
    "Z": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F),
    " ": (0, 0, 0, 0, 0, 0, 0),
    ".": (0, 0, 0, 0, 0, 0x0C, 0x0C),
    ",": (0, 0, 0, 0, 0x0C, 0x04, 0x08),
    ":": (0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0),
    "-": (0, 0, 0, 0x1F, 0, 0, 0),
    "+": (0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0),
    "%": (0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03),
    "[": (0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E),
    "]": (0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E),
    "(": (0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02),
    ")": (0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08),
    "/": (0, 0x01, 0x02, 0x04, 0x08, 0x10, 0),
    "_": (0, 0, 0, 0, 0, 0, 0x1F),
    "=": (0, 0, 0x1F, 0, 0x1F, 0, 0),
    "*": (0, 0x04, 0x15, 0x0E, 0x15, 0x04, 0),
    "?": (0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04),
}
GLYPH_WIDTH, GLYPH_HEIGHT = 6, 8  # 5x7 plus spacing


class Canvas:
    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * width * height)

    def fill(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill the rectangle [x0, x1) x [y0, y1), clipped to the canvas."""
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        if x0 >= x1:
            return
        row = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = (y * self.width + x0) * 3
            self.pixels[start : start + len(row)] = row

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> None:
        for i, char in enumerate(text.upper()):
            glyph = _FONT.get(char, _FONT["?"])
            left = x + i * GLYPH_WIDTH * scale
            for row, bits in enumerate(glyph):
                for column in range(5):
                    if bits & (0x10 >> column):
                        top = y + row * scale
                        self.fill(
                            left + column * scale,
                            top,
                            left + (column + 1) * scale,
                            top + scale,
                            color,
                        )

    def png(self) -> bytes:
        raw = b"".join(
            b"\0" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3])
            for y in range(self.height)
        )
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b"")
        )


def text_width(text: str, scale: int = 2) -> int:
    return len(text) * GLYPH_WIDTH * scale


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    low: float | None = None
    high: float | None = None


def bar_chart(path: Path, title: str, bars: Sequence[Bar], value_format: str = "{:.3g}") -> None:
    """Write a bar chart (one bar per arm, whiskers for its interval) as a PNG file."""
    width, height = max(160 + 150 * max(1, len(bars)), text_width(title) + 40), 400
    canvas = Canvas(width, height)
    canvas.text(20, 16, title)
    top, bottom, left = 70, height - 60, 70
    peak = max([b.high if b.high is not None else b.value for b in bars] + [0.0])
    scale = (bottom - top) / (peak * 1.1) if peak > 0 else 0.0
    canvas.fill(left, top - 10, left + 2, bottom + 1, BLACK)
    canvas.fill(left, bottom, width - 20, bottom + 2, BLACK)
    for fraction in (0.5, 1.0):
        y = bottom - round(peak * fraction * scale)
        if peak > 0:
            canvas.fill(left + 2, y, width - 20, y + 1, GREY)
            canvas.text(4, y - 6, value_format.format(peak * fraction), scale=1)
    for i, bar in enumerate(bars):
        x = left + 40 + i * 150
        y = bottom - round(max(0.0, bar.value) * scale)
        canvas.fill(x, y, x + 80, bottom, PALETTE[i % len(PALETTE)])
        if bar.low is not None and bar.high is not None:
            y_low = bottom - round(max(0.0, bar.low) * scale)
            y_high = bottom - round(max(0.0, bar.high) * scale)
            canvas.fill(x + 39, y_high, x + 41, y_low + 1, BLACK)
            canvas.fill(x + 30, y_high, x + 50, y_high + 2, BLACK)
            canvas.fill(x + 30, y_low - 1, x + 50, y_low + 1, BLACK)
        label = value_format.format(bar.value)
        above = y if bar.high is None else min(y, bottom - round(max(0.0, bar.high) * scale))
        canvas.text(x + 40 - text_width(label, 1) // 2, above - 14, label, scale=1)
        name = bar.label[:20]
        canvas.text(x + 40 - text_width(name, 1) // 2, bottom + 14, name, scale=1)
    path.write_bytes(canvas.png())
