#!/usr/bin/env python3
"""Reads a TensorBoard event file with nothing but the standard library.

An independent check of train/tensorboard.cpp, written from the formats'
documentation rather than from our .proto or any protobuf library:

  TFRecord: each record is
    uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
    the data, uint32 masked CRC-32C of the data,
  where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32) and
  CRC-32C is the Castagnoli CRC (reflected polynomial 0x82F63B78).

  Event (protobuf wire format): wall_time = 1 (double), step = 2 (int64),
  file_version = 3 (string), summary = 5 (Summary); Summary: value = 1
  (repeated Value); Value: tag = 1 (string), simple_value = 2 (float).

Usage: read_tfevents.py FILE

Prints one JSON object per line, in file order:
  {"file_version": "brain.Event:2", "wall_time": 1700000000.25}
  {"tag": "train/loss", "step": 10, "value": 0.25, "wall_time": 1700000001.5}
A value is the float widened to a double; NaN and infinities, which JSON has
no numbers for, are the strings "NaN", "Infinity" and "-Infinity". A damaged
file (a CRC mismatch, a torn record, a malformed message) exits with status 1
and a message on stderr naming the file and the record's byte offset.
"""

import json
import math
import struct
import sys


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class Malformed(Exception):
    pass


def varint(buf, pos):
    """(value, next position) of the base-128 varint at buf[pos]."""
    value = 0
    for i in range(10):
        if pos + i >= len(buf):
            raise Malformed("varint runs past the end of the message")
        b = buf[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return value, pos + i + 1
    raise Malformed("varint longer than 10 bytes")


def fields(buf):
    """Yields (field number, wire type, value) of a message: an int for
    varints, bytes for fixed64, fixed32 and length-delimited fields."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed("field number 0")
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(buf):
                raise Malformed(f"field {number} runs past the end of the message")
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 2:
            size, pos = varint(buf, pos)
            if pos + size > len(buf):
                raise Malformed(f"field {number} ({size} bytes) runs past the end of the message")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise Malformed(f"field {number} has wire type {wire} (groups are not used)")
        yield number, wire, value


def expect(number, wire, want, what):
    if wire != want:
        raise Malformed(f"{what} (field {number}) has wire type {wire}, expected {want}")


def text(value, what):
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Malformed(f"{what} is not UTF-8: {e}")


def summary_values(buf):
    """(tag, float) of each Summary.Value holding a simple_value."""
    out = []
    for number, wire, value in fields(buf):
        if number != 1:
            continue
        expect(number, wire, 2, "Summary.value")
        tag, simple = "", None
        for n, w, v in fields(value):
            if n == 1:
                expect(n, w, 2, "Value.tag")
                tag = text(v, "Value.tag")
            elif n == 2:
                expect(n, w, 5, "Value.simple_value")
                simple = struct.unpack("<f", v)[0]
        if simple is not None:
            out.append((tag, simple))
    return out


def event_lines(buf):
    wall_time, step, version, values = 0.0, 0, None, []
    for number, wire, value in fields(buf):
        if number == 1:
            expect(number, wire, 1, "Event.wall_time")
            wall_time = struct.unpack("<d", value)[0]
        elif number == 2:
            expect(number, wire, 0, "Event.step")
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3:
            expect(number, wire, 2, "Event.file_version")
            version = text(value, "Event.file_version")
        elif number == 5:
            expect(number, wire, 2, "Event.summary")
            values += summary_values(value)
    lines = []
    if version is not None:
        lines.append({"file_version": version, "wall_time": wall_time})
    for tag, v in values:
        if math.isnan(v):
            v = "NaN"
        elif math.isinf(v):
            v = "Infinity" if v > 0 else "-Infinity"
        lines.append({"tag": tag, "step": step, "value": v, "wall_time": wall_time})
    return lines


def records(buf):
    """Yields (offset, data) of each record, checking both CRCs."""
    pos = 0
    while pos < len(buf):
        if len(buf) - pos < 12:
            raise Malformed(f"record at byte {pos}: torn header ({len(buf) - pos} of 12 bytes)")
        header = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        if length_crc != masked_crc32c(header):
            raise Malformed(f"record at byte {pos}: length CRC mismatch (stored {length_crc:#010x}, "
                            f"computed {masked_crc32c(header):#010x})")
        end = pos + 12 + length + 4
        if end > len(buf):
            raise Malformed(f"record at byte {pos}: torn, {length} data bytes + 4 CRC bytes "
                            f"announced, {len(buf) - pos - 12} present")
        data = buf[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", buf[end - 4:end])
        if data_crc != masked_crc32c(data):
            raise Malformed(f"record at byte {pos}: data CRC mismatch (stored {data_crc:#010x}, "
                            f"computed {masked_crc32c(data):#010x})")
        yield pos, data
        pos = end


def main(argv):
    if len(argv) != 2:
        print("usage: read_tfevents.py FILE", file=sys.stderr)
        return 2
    path = argv[1]
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        print(f"{path}: cannot read: {e.strerror}", file=sys.stderr)
        return 1
    try:
        for pos, data in records(buf):
            try:
                lines = event_lines(data)
            except Malformed as e:
                raise Malformed(f"record at byte {pos}: {e}")
            for line in lines:
                print(json.dumps(line, allow_nan=False))
    except Malformed as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
