#!/usr/bin/env python3
"""Writes the treecast wire test vectors (values.json, frames.json, control.json, invalid.json).

This is an independent reference encoder written from docs/wire-format.md with
Python's `struct`, NOT a dump of what the Rust code prints: the Rust test
crates/wire/tests/vectors.rs checks the Rust codec against these files.

Run from anywhere: python3 testdata/wire/gen_vectors.py
"""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# spec -> (type code, struct format or None for strings)
SCALARS = {
    "%c": (1, "<b"),
    "%uc": (2, "<B"),
    "%hd": (3, "<h"),
    "%uhd": (4, "<H"),
    "%d": (5, "<i"),
    "%ud": (6, "<I"),
    "%ld": (7, "<q"),
    "%uld": (8, "<Q"),
    "%f": (9, "<f"),
    "%lf": (10, "<d"),
    "%s": (11, None),
}
ARRAY_BIT = 0x40
BYTES_CODE = 0x20
WIDE = {"%ld", "%uld"}  # 64-bit integers travel as JSON strings


def u32(n):
    return struct.pack("<I", n)


def enc_str(s):
    b = s.encode("utf-8")
    return u32(len(b)) + b


def enc_scalar(spec, v):
    code, fmt = SCALARS[spec]
    if fmt is None:
        return enc_str(v)
    if spec in WIDE:
        v = int(v)
    if spec == "%f":
        # Vectors only use floats that f32 holds exactly.
        assert struct.unpack("<f", struct.pack("<f", v))[0] == v, v
    return struct.pack(fmt, v)


def element_spec(spec):
    """'%ad' -> '%d', '%Alf' -> '%lf', '%d' -> None."""
    if spec[:2] in ("%a", "%A") and spec != "%b":
        return "%" + spec[2:]
    return None


def enc_value(spec, v):
    if spec == "%b":
        data = bytes.fromhex(v)
        return bytes([BYTES_CODE]) + u32(len(data)) + data
    elem = element_spec(spec)
    if elem is not None:
        code = ARRAY_BIT | SCALARS[elem][0]
        return bytes([code]) + u32(len(v)) + b"".join(enc_scalar(elem, x) for x in v)
    return bytes([SCALARS[spec][0]]) + enc_scalar(spec, v)


def V(spec, value):
    return {"type": spec, "value": value}


I64_MIN, I64_MAX, U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1

VALUE_CASES = [
    ("empty payload", "", []),
    ("char min", "%c", [V("%c", -128)]),
    ("char max", "%c", [V("%c", 127)]),
    ("uchar min max", "%uc %uc", [V("%uc", 0), V("%uc", 255)]),
    ("short min max", "%hd %hd", [V("%hd", -32768), V("%hd", 32767)]),
    ("ushort min max", "%uhd %uhd", [V("%uhd", 0), V("%uhd", 65535)]),
    ("int min max", "%d %d", [V("%d", -(2**31)), V("%d", 2**31 - 1)]),
    ("int negative one", "%d", [V("%d", -1)]),
    ("uint min max", "%ud %ud", [V("%ud", 0), V("%ud", 2**32 - 1)]),
    ("long min max", "%ld %ld", [V("%ld", str(I64_MIN)), V("%ld", str(I64_MAX))]),
    ("long negative", "%ld", [V("%ld", "-5")]),
    ("ulong min max", "%uld %uld", [V("%uld", "0"), V("%uld", str(U64_MAX))]),
    ("float", "%f %f %f", [V("%f", 1.5), V("%f", -0.25), V("%f", 0.0)]),
    ("double", "%lf %lf %lf", [V("%lf", 1.5), V("%lf", -0.25), V("%lf", 1e300)]),
    ("string ascii", "%s", [V("%s", "hello")]),
    ("string empty", "%s", [V("%s", "")]),
    ("string unicode", "%s", [V("%s", "h\u00e9 \u2192 \U0001F333")]),
    ("bytes", "%b", [V("%b", "00ff10")]),
    ("bytes empty", "%b", [V("%b", "")]),
    ("char array", "%ac", [V("%ac", [-128, 0, 127])]),
    ("uchar array", "%auc", [V("%auc", [0, 1, 255])]),
    ("short array", "%ahd", [V("%ahd", [-32768, -1, 32767])]),
    ("ushort array", "%auhd", [V("%auhd", [0, 65535])]),
    ("int array", "%ad", [V("%ad", [1, -2, 2**31 - 1])]),
    ("uint array", "%aud", [V("%aud", [0, 2**32 - 1])]),
    ("long array", "%ald", [V("%ald", [str(I64_MIN), "-1", str(I64_MAX)])]),
    ("ulong array", "%auld", [V("%auld", ["1", str(U64_MAX)])]),
    ("float array", "%af", [V("%af", [1.5, -0.25])]),
    ("double array", "%alf", [V("%alf", [0.5, -1024.125])]),
    ("string array", "%as", [V("%as", ["a", "", "\u00e9t\u00e9"])]),
    (
        "empty arrays",
        "%ac %auc %ahd %auhd %ad %aud %ald %auld %af %alf %as",
        [V(s, []) for s in ["%ac", "%auc", "%ahd", "%auhd", "%ad", "%aud", "%ald", "%auld", "%af", "%alf", "%as"]],
    ),
    (
        "mixed record",
        "%d %alf %s",
        [V("%d", 42), V("%alf", [1.5, 2.25]), V("%s", "node-3")],
    ),
    ("no spaces and synonym", "%d%Ad  %b", [V("%d", 7), V("%ad", [8]), V("%b", "2a")]),
]


def gen_values():
    out = []
    for name, fmt, values in VALUE_CASES:
        payload = b"".join(enc_value(v["type"], v["value"]) for v in values)
        out.append({"name": name, "format": fmt, "values": values, "hex": payload.hex()})
    return out


PROTOCOL_VERSION = 1
KINDS = {"data": 1, "control": 2, "credit": 3}


def enc_frame(kind, flags, stream, tag, rank, ts, payload):
    hdr = struct.pack("<BBHIiIQI", PROTOCOL_VERSION, KINDS[kind], flags, stream, tag, rank, ts, len(payload))
    assert len(hdr) == 28
    return hdr + payload


def gen_frames():
    cases = [
        ("data empty payload", "data", 0, 1, 0, 0, 0, b""),
        ("data int 5", "data", 0, 7, -3, 12, 1_700_000_000_123_456_789, enc_value("%d", 5)),
        ("direct downstream", "data", 1, 2, 100, 4_000_000_000, 0, enc_value("%s", "go")),
        ("partial avg", "data", 2, 3, 0, 0, 0, enc_value("%lf", 1.5) + enc_value("%uld", "4")),
        ("all fields max", "data", 0xFFFF, 2**32 - 1, 2**31 - 1, 2**32 - 1, str(U64_MAX), b"\x00\x01"),
        ("control shutdown", "control", 0, 0, 0, 0, 0, bytes([8])),
        ("credit 64 on stream 5", "credit", 0, 5, 64, 0, 0, b""),
        (
            "worked example in docs/wire-format.md",
            "data",
            0,
            7,
            -3,
            12,
            0,
            enc_value("%d", 42) + enc_value("%alf", [1.5, 2.25]) + enc_value("%s", "node-3"),
        ),
    ]
    out = []
    for name, kind, flags, stream, tag, rank, ts, payload in cases:
        wire = enc_frame(kind, flags, stream, tag, rank, int(ts), payload)
        out.append(
            {
                "name": name,
                "kind": kind,
                "flags": flags,
                "stream": stream,
                "tag": tag,
                "rank": rank,
                "timestamp_ns": str(ts),
                "payload_hex": payload.hex(),
                "hex": wire.hex(),
            }
        )
    return out


def enc_ranks(text):
    """'0-15,32' -> u32 count of ranges, then lo, hi pairs (already sorted and merged)."""
    ranges = []
    for item in filter(None, text.split(",")):
        lo, _, hi = item.partition("-")
        ranges.append((int(lo), int(hi or lo)))
    return u32(len(ranges)) + b"".join(u32(a) + u32(b) for a, b in ranges)


SYNC = {"wait_for_all": 0, "timeout": 1, "do_not_wait": 2}
FILTERS = {"null": 0, "sum": 1, "min": 2, "max": 3, "avg": 4, "concat": 5, "eqclass": 6}


def enc_control(m):
    t = m["type"]
    if t == "subtree":
        out = bytes([1]) + enc_str(m["topology"])
        out += u32(m["first_id"]) + u32(m["first_rank"]) + u32(m["total_backends"])
        out += u32(len(m["backend"])) + b"".join(enc_str(a) for a in m["backend"])
        out += u32(len(m["env"])) + b"".join(enc_str(k) + enc_str(v) for k, v in m["env"])
        return out + u32(m["startup_timeout_ms"])
    if t == "ready":
        return bytes([2]) + enc_ranks(m["ranks"]) + u32(m["commnodes"])
    if t == "launch_failed":
        return bytes([3]) + enc_str(m["message"])
    if t == "new_stream":
        sync = bytes([SYNC[m["sync"]]]) + u32(m.get("timeout_ms", 0))
        return (
            bytes([4]) + u32(m["id"]) + enc_ranks(m["ranks"]) + sync + bytes([FILTERS[m["up"]], FILTERS[m["down"]]])
        )
    if t == "close_stream":
        return bytes([5]) + u32(m["id"])
    if t == "ranks_lost":
        return bytes([6]) + enc_ranks(m["ranks"]) + enc_str(m["reason"])
    if t == "filter_error":
        return bytes([7]) + u32(m["stream"]) + u32(m["rank"]) + enc_str(m["message"])
    if t == "shutdown":
        return bytes([8])
    if t == "attach_points":
        out = bytes([9]) + u32(len(m["points"]))
        return out + b"".join(u32(r) + u32(i) + enc_str(a) for r, i, a in m["points"])
    raise ValueError(t)


CONTROL_CASES = [
    (
        "subtree",
        {
            "type": "subtree",
            "topology": "localhost:1 => localhost:2 ;",
            "first_id": 1,
            "first_rank": 0,
            "total_backends": 4,
            "backend": ["/bin/tool", "-v"],
            "env": [["A", "b"]],
            "startup_timeout_ms": 30000,
        },
    ),
    (
        "subtree generic backend",
        {
            "type": "subtree",
            "topology": "h:0 ;",
            "first_id": 0,
            "first_rank": 0,
            "total_backends": 1,
            "backend": [],
            "env": [],
            "startup_timeout_ms": 0,
        },
    ),
    ("ready", {"type": "ready", "ranks": "0-15,32", "commnodes": 5}),
    ("ready empty", {"type": "ready", "ranks": "", "commnodes": 1}),
    ("launch failed", {"type": "launch_failed", "message": "node 3 on h\u00f4te: exited 1"}),
    (
        "new stream",
        {"type": "new_stream", "id": 3, "ranks": "4-7", "sync": "timeout", "timeout_ms": 50, "up": "sum", "down": "null"},
    ),
    (
        "new stream eqclass",
        {"type": "new_stream", "id": 1, "ranks": "0,2,4", "sync": "wait_for_all", "up": "eqclass", "down": "concat"},
    ),
    ("close stream", {"type": "close_stream", "id": 3}),
    ("ranks lost", {"type": "ranks_lost", "ranks": "7", "reason": "link closed"}),
    ("filter error", {"type": "filter_error", "stream": 2, "rank": 1, "message": "bad"}),
    ("shutdown", {"type": "shutdown"}),
    ("attach points", {"type": "attach_points", "points": [[0, 3, "unix:@treecast-ab"], [1, 3, "10.0.0.1:4000"]]}),
    ("attach points empty", {"type": "attach_points", "points": []}),
]


def gen_control():
    return [{"name": n, "msg": m, "hex": enc_control(m).hex()} for n, m in CONTROL_CASES]


def hdr(kind=1, length=0, version=PROTOCOL_VERSION):
    return struct.pack("<BBHIiIQI", version, kind, 0, 1, 0, 0, 0, length)


INVALID_CASES = [
    # values: decode_values
    ("values", "type code alone", bytes([5]), "Truncated"),
    ("values", "truncated int", bytes([5, 1, 0]), "Truncated"),
    ("values", "truncated double", bytes([10]) + b"\x00" * 7, "Truncated"),
    ("values", "string longer than payload", bytes([11]) + u32(9) + b"abc", "Truncated"),
    ("values", "string length missing", bytes([11, 1, 0]), "Truncated"),
    ("values", "bad utf8 string", bytes([11]) + u32(2) + b"\xc3\x28", "InvalidUtf8"),
    ("values", "surrogate in utf8", bytes([11]) + u32(3) + b"\xed\xa0\x80", "InvalidUtf8"),
    ("values", "bad utf8 in string array", bytes([0x4B]) + u32(2) + enc_str("ok") + u32(1) + b"\xff", "InvalidUtf8"),
    ("values", "unknown code 0", bytes([0]), "UnknownTypeCode"),
    ("values", "unknown code 12", bytes([12, 0, 0, 0, 0]), "UnknownTypeCode"),
    ("values", "array of nothing", bytes([0x40]) + u32(0), "UnknownTypeCode"),
    ("values", "array of bytes", bytes([0x60]) + u32(0), "UnknownTypeCode"),
    ("values", "trailing garbage byte", enc_value("%d", 0) + b"\xff", "UnknownTypeCode"),
    ("values", "trailing partial value", enc_value("%d", 0) + bytes([5, 0]), "Truncated"),
    ("values", "hostile ulong array count", bytes([0x48]) + u32(0xFFFFFFFF) + b"\x00" * 16, "Truncated"),
    ("values", "array count one too many", bytes([0x45]) + u32(3) + b"\x00" * 8, "Truncated"),
    ("values", "hostile string array count", bytes([0x4B]) + u32(0xFFFFFFFF) + b"\x00" * 8, "Truncated"),
    ("values", "bytes longer than payload", bytes([0x20]) + u32(4) + b"\x01\x02", "Truncated"),
    # batch: decode_batch
    ("batch", "bad version", hdr(version=2), "BadVersion"),
    ("batch", "unknown kind", hdr(kind=4), "UnknownKind"),
    ("batch", "payload over 256 MiB", hdr(length=(256 << 20) + 1), "TooLong"),
    ("batch", "truncated header", hdr()[:27], "Truncated"),
    ("batch", "truncated payload", hdr(length=4) + b"\x01\x02", "Truncated"),
    ("batch", "trailing partial frame", hdr() + b"\x01", "Truncated"),
    # control: ControlMsg::decode
    ("control", "empty", b"", "Truncated"),
    ("control", "unknown tag", bytes([0xEE]), "UnknownControl"),
    ("control", "tag zero", bytes([0]), "UnknownControl"),
    ("control", "shutdown with trailing byte", bytes([8, 0]), "TrailingBytes"),
    ("control", "close stream truncated", bytes([5, 1, 0]), "Truncated"),
    ("control", "ranks unsorted", bytes([2]) + u32(2) + u32(5) + u32(6) + u32(0) + u32(1) + u32(1), "Invalid"),
    ("control", "ranks adjacent", bytes([2]) + u32(2) + u32(0) + u32(1) + u32(2) + u32(3) + u32(1), "Invalid"),
    ("control", "range reversed", bytes([2]) + u32(1) + u32(3) + u32(1) + u32(1), "Invalid"),
    (
        "control",
        "unknown sync mode",
        bytes([4]) + u32(1) + enc_ranks("0") + bytes([3]) + u32(0) + bytes([0, 0]),
        "Invalid",
    ),
    (
        "control",
        "unknown filter",
        bytes([4]) + u32(1) + enc_ranks("0") + bytes([0]) + u32(0) + bytes([7, 0]),
        "Invalid",
    ),
    ("control", "bad utf8 message", bytes([3]) + u32(1) + b"\x80", "InvalidUtf8"),
]


def gen_invalid():
    return [{"decoder": d, "name": n, "hex": h.hex(), "error": e} for d, n, h, e in INVALID_CASES]


def write(name, data):
    """One case per line: diffs stay readable and any JSON reader copes."""
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in data) + "\n]\n")


if __name__ == "__main__":
    write("values.json", gen_values())
    write("frames.json", gen_frames())
    write("control.json", gen_control())
    write("invalid.json", gen_invalid())
