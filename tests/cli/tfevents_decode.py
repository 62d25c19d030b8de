"""An independent reader of TensorBoard event files (Python 3 standard library only), for
tests/cli/tensorboard.sh: TFRecord framing with both masked CRC-32Cs checked (CRC-32C computed
here bit by bit), and the tensorflow.Event / Summary protobufs decoded from the wire format.

events(path) -> [{"wall_time", "step", "file_version"?, "tag"?, "value"?}], raising ValueError on
a bad CRC, a truncated record or a malformed message. As a script: prints one JSON line per event.
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob):
    at = 0
    while at < len(blob):
        if len(blob) - at < 12:
            raise ValueError("truncated record header at byte %d" % at)
        header = blob[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
        if length_crc != masked(crc32c(header)):
            raise ValueError("length CRC mismatch at byte %d" % at)
        end = at + 12 + length
        if end + 4 > len(blob):
            raise ValueError("truncated record at byte %d" % at)
        data = blob[at + 12:end]
        (data_crc,) = struct.unpack("<I", blob[end:end + 4])
        if data_crc != masked(crc32c(data)):
            raise ValueError("data CRC mismatch at byte %d" % at)
        yield data
        at = end + 4


def fields(msg):
    """(field number, wire type, value) of a protobuf message, in order."""
    at = 0

    def varint():
        nonlocal at
        value, shift = 0, 0
        while True:
            if at >= len(msg) or shift > 63:
                raise ValueError("bad varint")
            b = msg[at]
            at += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while at < len(msg):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
        elif wire == 1:
            value = msg[at:at + 8]
            at += 8
        elif wire == 5:
            value = msg[at:at + 4]
            at += 4
        elif wire == 2:
            n = varint()
            value = msg[at:at + n]
            at += n
        else:
            raise ValueError("wire type %d" % wire)
        if at > len(msg):
            raise ValueError("field %d runs past the message" % number)
        yield number, wire, value


def event(data):
    out = {"wall_time": None, "step": 0}
    for number, wire, value in fields(data):
        if number == 1 and wire == 1:
            out["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            out["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire == 2:
            out["file_version"] = value.decode()
        elif number == 5 and wire == 2:
            for vn, vw, v in fields(value):  # Summary.value
                if vn != 1 or vw != 2:
                    continue
                for n, w, x in fields(v):  # Summary.Value
                    if n == 1 and w == 2:
                        out["tag"] = x.decode()
                    elif n == 2 and w == 5:
                        out["value"] = struct.unpack("<f", x)[0]
    if out["wall_time"] is None:
        raise ValueError("an event without wall_time")
    return out


def events(path):
    with open(path, "rb") as f:
        return [event(r) for r in records(f.read())]


if __name__ == "__main__":
    for e in events(sys.argv[1]):
        print(json.dumps(e))
