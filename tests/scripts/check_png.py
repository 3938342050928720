#!/usr/bin/env python3
"""Checks a screenshot of a run report (PNG, decoded here with zlib alone): it is at
least 600 x 600, not blank (over 2% of the pixels are not white), and the report's
first series colour (#1f77b4, the charts' lines and the memory bars) covers at least
500 pixels, so the SVG charts were drawn, not just the text.

    check_png.py SHOT.png
"""
import struct
import sys
import zlib


def pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    at, idat, width = 8, b"", 0
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunk = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG (depth {depth}, colour {color})")
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        at += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def main() -> int:
    width, height, bpp, rows = pixels(sys.argv[1])
    ink = blue = 0
    for line in rows:
        for x in range(0, width * bpp, bpp):
            r, g, b = line[x], line[x + 1], line[x + 2]
            if (r, g, b) != (255, 255, 255):
                ink += 1
            if abs(r - 0x1f) < 24 and abs(g - 0x77) < 24 and abs(b - 0xb4) < 24:
                blue += 1
    share = ink / (width * height)
    print(f"check_png: {width} x {height}, {100 * share:.1f}% drawn, {blue} series-blue pixels")
    ok = width >= 600 and height >= 600 and share > 0.02 and blue >= 500
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
