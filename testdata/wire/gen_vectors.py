#!/usr/bin/env python3
"""Writes the treecast wire test vectors (values.json, frames.json, control.json, invalid.json),
protocol version 11 (launch plan version 12, member plan version 3).

This is an independent reference encoder written from docs/wire-format.md with
Python's `struct`, NOT a dump of what the Rust code prints: the Rust test
crates/wire/tests/vectors.rs checks the Rust codec against these files.

Run from anywhere: python3 testdata/wire/gen_vectors.py
"""

import hashlib
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


PROTOCOL_VERSION = 11
KINDS = {"data": 1, "control": 2, "credit": 3, "peer": 5}


def u16(n):
    return struct.pack("<H", n)


def u64(n):
    return struct.pack("<Q", int(n))


def i64(n):
    return struct.pack("<q", int(n))


def enc_frame(kind, flags, stream, tag, rank, ts, payload, version=PROTOCOL_VERSION):
    hdr = struct.pack("<BBHIiIQI", version, KINDS[kind], flags, stream, tag, rank, ts, len(payload))
    assert len(hdr) == 28
    return hdr + payload


def enc_grant(packets, nbytes):
    """A credit frame's payload: packets u32, bytes u64 (12 bytes)."""
    return u32(packets) + u64(nbytes)


def enc_collective(op, combine, down, context, seq, root, members, contributors, error, order=()):
    """A collective frame's head: op u8, combine u8, direction u8, context u64,
    seq u32, root u32, members and contributors as rank sets, the error string,
    then a reduce-scatter's order (u32 count, u32 ranks; 0 for the others)."""
    return (
        bytes([op, combine, down])
        + u64(context)
        + u32(seq)
        + u32(root)
        + enc_ranks(members)
        + enc_ranks(contributors)
        + enc_str(error)
        + u32(len(order))
        + b"".join(u32(r) for r in order)
    )


def gen_frames():
    # (name, kind, flags, stream, tag, rank, timestamp, payload, grant or None)
    cases = [
        ("data empty payload", "data", 0, 1, 0, 0, 0, b"", None),
        ("data int 5", "data", 0, 7, -3, 12, 1_700_000_000_123_456_789, enc_value("%d", 5), None),
        ("direct downstream", "data", 1, 2, 100, 4_000_000_000, 0, enc_value("%s", "go"), None),
        ("partial avg", "data", 2, 3, 0, 0, 0, enc_value("%lf", 1.5) + enc_value("%uld", "4"), None),
        ("all fields max", "data", 0xFFFF, 2**32 - 1, 2**31 - 1, 2**32 - 1, str(U64_MAX), b"\x00\x01", None),
        ("control shutdown", "control", 0, 0, 0, 0, 0, bytes([8]), None),
        ("peer message from rank 3 to rank 17", "peer", 0, 17, 9, 3, 0, enc_value("%s", "hi"), None),
        ("peer acknowledgement", "peer", 16, 3, 0, 17, 0, u32(1) + u64(12), None),
        (
            "peer message for ranks 4-6",
            "peer",
            32,
            2**32 - 1,
            9,
            3,
            0,
            enc_ranks("4-6") + enc_value("%s", "hi"),
            None,
        ),
        (
            "collective all-reduce (sum) contribution of rank 5 among ranks 4-11",
            "peer",
            64,
            2**32 - 1,
            0,
            5,
            0,
            enc_collective(2, 1, 0, 0x0102030405060708, 9, 2**32 - 1, "4-11", "5", "") + enc_value("%d", 7),
            None,
        ),
        (
            "collective reduce result that failed, down to ranks 4-5",
            "peer",
            64,
            2**32 - 1,
            0,
            4,
            0,
            enc_collective(1, 2, 1, 7, 0, 40, "4-5", "4-11", "no"),
            None,
        ),
        (
            "collective reduce-scatter result narrowed to ranks 6 and 4 (group order 6, 4)",
            "peer",
            64,
            2**32 - 1,
            0,
            4,
            0,
            enc_collective(4, 1, 1, 7, 1, 2**32 - 1, "4,6", "4-11", "", (6, 4)) + enc_value("%ad", [1, 2, 3, 4]),
            None,
        ),
        ("credit half an up window on stream 5", "credit", 0, 5, 0, 0, 0, None, (128, 512 << 10)),
        ("credit half a down window on stream 1", "credit", 0, 1, 0, 0, 0, None, (128, 4 << 20)),
        ("credit max", "credit", 0, 2**32 - 1, 0, 0, 0, None, (2**32 - 1, U64_MAX)),
        (
            "worked example in docs/wire-format.md",
            "data",
            0,
            7,
            -3,
            12,
            0,
            enc_value("%d", 42) + enc_value("%alf", [1.5, 2.25]) + enc_value("%s", "node-3"),
            None,
        ),
    ]
    out = []
    for name, kind, flags, stream, tag, rank, ts, payload, grant in cases:
        if grant is not None:
            payload = enc_grant(*grant)
        wire = enc_frame(kind, flags, stream, tag, rank, int(ts), payload)
        case = {
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
        if grant is not None:
            case["grant"] = {"packets": grant[0], "bytes": str(grant[1])}
        out.append(case)
    return out


def enc_ranks(text):
    """'0-15,32' -> u32 count of ranges, then lo, hi pairs (already sorted and merged)."""
    ranges = []
    for item in filter(None, text.split(",")):
        lo, _, hi = item.partition("-")
        ranges.append((int(lo), int(hi or lo)))
    return u32(len(ranges)) + b"".join(u32(a) + u32(b) for a, b in ranges)


def enc_bytes_str(b):
    """A string field from raw bytes (for invalid UTF-8)."""
    return u32(len(b)) + b


def enc_flag(v):
    """A bool as one byte 0/1; an int is written as it is (for invalid vectors)."""
    return bytes([int(v)])


SYNC = {"wait_for_all": 0, "timeout": 1, "do_not_wait": 2}
ROUTES = {"unix": 0, "tcp": 1}
PLAN_VERSION = 12
MEMBER_PLAN_VERSION = 3
CLOCK_FIELDS = ["resync_ms", "probes", "probe_burst", "probe_gap_us"]


def enc_strings(items):
    return u32(len(items)) + b"".join(enc_str(s) for s in items)


def enc_plan(p, version=PLAN_VERSION):
    """The launch plan, field by field, in the order of docs/wire-format.md."""
    out = u16(version) + enc_str(p["session"])
    out += u32(p["node_id"]) + u32(p["first_rank"]) + u32(p["total_backends"])
    out += enc_str(p["topology"])
    out += enc_strings(p["backend"])
    out += u32(len(p["env"])) + b"".join(enc_str(k) + enc_str(v) for k, v in p["env"])
    out += u32(p["startup_timeout_ms"]) + u32(p["attach_ms"])
    out += enc_flag(p["allow_missing"])
    out += bytes([ROUTES.get(p["local_route"], p["local_route"])])
    out += enc_str(p["listen"]) + enc_str(p["remote_listen"])
    la = p["launcher"]
    out += enc_str(la["name"])
    out += enc_str(la["program"]) + enc_strings(la["args"]) + u32(la["connect_timeout_s"])
    out += enc_str(la["remote_path"])
    out += u32(p["max_frame"]) + enc_str(p["log"])
    out += u32(p["heartbeat_ms"]) + u32(p["dead_after_ms"]) + u32(p["rejoin_ms"])
    udp = p.get("udp")
    out += enc_flag(udp is not None)
    if udp is not None:
        out += u32(len(udp)) + b"".join(enc_str(k) + enc_str(v) for k, v in udp)
    out += u32(p.get("depth", 0)) + enc_strings(p.get("filters", []))
    out += u32(p["max_control"])
    out += enc_clock(p.get("clock", {})) + u32(p.get("zero_copy_min", 0))
    out += bytes([p.get("stripes", 0)]) + enc_flag(p.get("mptcp", False)) + enc_str(la.get("remote_prefix", ""))
    out += u32(p.get("stripe_stall_ms", 0))
    return out + enc_strings(p.get("rails", []))


def enc_clock(c):
    """Clock settings: each optional count a flag and a u32 (0 when unset), then the knob."""
    out = b""
    for k in CLOCK_FIELDS:
        out += enc_flag(k in c) + u32(c.get(k, 0))
    return out + enc_str(c.get("distort", ""))


def enc_member_plan(p, version=MEMBER_PLAN_VERSION):
    """A back-end's plan, field by field, in the order of docs/wire-format.md."""
    out = u16(version) + u32(p["node_id"]) + u32(p["rank"]) + u32(p["size"])
    group = p.get("group")
    out += enc_flag(group is not None)
    if group is not None:
        out += u32(group["group"]) + u32(group["rank"]) + u32(group["size"])
    out += u32(p["heartbeat_ms"]) + u32(p["dead_after_ms"]) + u32(p["rejoin_ms"])
    out += enc_clock(p.get("clock", {})) + u32(p.get("zero_copy_min", 0))
    return out + u32(p.get("stripe_stall_ms", 0))


def enc_filter(f):
    params = bytes.fromhex(f.get("params_hex", ""))
    return enc_str(f["name"]) + u16(f["version"]) + u32(len(params)) + params


def enc_window(w):
    return u32(w["packets"]) + u64(w["bytes"])


STREAM_ROUTES = {"network": 0, "tcp": 1, "udp": 2, "striped": 3}


def enc_stream(m):
    out = u32(m["id"]) + enc_ranks(m["ranks"])
    out += bytes([SYNC[m["sync"]]]) + u32(m.get("timeout_ms", 0))
    out += enc_filter(m["up"]) + enc_filter(m["down"])
    out += enc_window(m["up_window"]) + enc_window(m["down_window"])
    out += u32(m.get("program", 0))
    return out + bytes([STREAM_ROUTES[m.get("route", "network")]])


def enc_control(m):
    t = m["type"]
    if t == "plan":
        return bytes([1]) + enc_plan(m)
    if t == "member_plan":
        return bytes([32]) + enc_member_plan(m)
    if t == "join":
        return bytes([2]) + enc_ranks(m["ranks"]) + u32(m["commnodes"])
    if t == "launch_failed":
        return bytes([3]) + enc_str(m["message"])
    if t == "new_stream":
        return bytes([4]) + enc_stream(m)
    if t == "close_stream":
        return bytes([5]) + u32(m["id"])
    if t == "leave":
        return bytes([6]) + enc_ranks(m["ranks"]) + enc_str(m["reason"]) + enc_flag(m["graceful"])
    if t == "filter_error":
        return bytes([7]) + u32(m["stream"]) + u32(m["rank"]) + enc_str(m["message"])
    if t == "shutdown":
        return bytes([8])
    if t == "attach_points":
        out = bytes([9]) + u32(len(m["points"]))
        return out + b"".join(u32(r) + u32(i) + enc_str(a) for r, i, a in m["points"])
    if t == "stream_refused":
        return bytes([10]) + u32(m["stream"]) + enc_str(m["node"]) + enc_str(m["message"])
    if t == "clock_probe":
        return bytes([11]) + u32(m["seq"]) + i64(m["sent_ns"])
    if t == "clock_reply":
        return bytes([12]) + u32(m["seq"]) + i64(m["sent_ns"]) + i64(m["child_ns"])
    if t == "clock_report":
        out = bytes([13]) + u32(len(m["samples"]))
        for s in m["samples"]:
            out += u32(s["node_id"]) + i64(s["offset_ns"]) + u64(s["error_ns"]) + u64(s["rtt_ns"])
            out += i64(s["drift_ppb"]) + u64(s["drift_error_ppb"]) + i64(s["measured_ns"])
        return out
    if t == "fallback":
        further = m["further"]
        return bytes([14]) + enc_str(m["address"]) + u32(len(further)) + b"".join(enc_str(a) for a in further)
    if t == "rejoin":
        out = bytes([15]) + enc_ranks(m["ranks"]) + u32(m["commnodes"]) + enc_str(m["name"])
        return out + u32(len(m["streams"])) + b"".join(u32(i) for i in m["streams"])
    if t == "orphaned":
        return bytes([16]) + enc_str(m["node"]) + enc_ranks(m["ranks"]) + enc_str(m["reason"])
    if t == "rejoined":
        return bytes([17]) + enc_ranks(m["ranks"]) + u32(m["commnodes"]) + enc_str(m["parent"])
    if t == "link_clock":
        return bytes([18]) + i64(m["offset_ns"]) + i64(m["drift_ppb"]) + i64(m["measured_ns"])
    if t == "monitor_start":
        return bytes([19]) + u32(m["program"])
    if t == "monitor_stop":
        return bytes([20])
    if t == "monitor_collect":
        mode = {"merged": 0, "per_node": 1, "confirm": 2}[m["mode"]]
        return bytes([21]) + u32(m["id"]) + bytes([mode]) + u32(m["limit_ms"])
    if t == "monitor_report":
        return bytes([22]) + u32(m["id"]) + enc_str(m["json"])
    if t == "spawn":
        keys = ["target", "first_node_id", "first_rank", "count", "size", "group", "group_first", "group_size"]
        out = bytes([23]) + b"".join(u32(m[k]) for k in keys)
        out += u32(len(m["command"])) + b"".join(enc_str(a) for a in m["command"])
        return out + enc_flag(m["attach"]) + enc_str(m["host"]) + enc_flag(m["light"])
    if t == "stop":
        return bytes([24]) + enc_ranks(m["ranks"]) + enc_str(m["reason"])
    if t == "spawn_request":
        out = bytes([25]) + u32(m["id"]) + u32(m["rank"]) + u32(m["n"])
        return out + u32(len(m["command"])) + b"".join(enc_str(a) for a in m["command"])
    if t == "spawn_reply":
        out = bytes([26]) + u32(m["id"]) + u32(m["rank"]) + u32(m["group"])
        return out + enc_ranks(m["ranks"]) + enc_str(m["error"])
    if t == "set_params":
        params = bytes.fromhex(m["params_hex"])
        return bytes([28]) + u32(m["stream"]) + u32(len(params)) + params
    if t == "set_down_params":
        params = bytes.fromhex(m["params_hex"])
        return bytes([31]) + u32(m["stream"]) + u32(len(params)) + params
    if t == "filter_state":
        state = bytes.fromhex(m["state_hex"])
        return bytes([29]) + u32(m["stream"]) + u32(len(state)) + state
    if t == "filter_refused":
        return bytes([30]) + bytes.fromhex(m["sha256"]) + enc_str(m["node"]) + enc_str(m["reason"])
    if t == "load_filter":
        data = bytes.fromhex(m["bytes_hex"])
        return bytes([27]) + enc_str(m["label"]) + bytes.fromhex(m["sha256"]) + u32(len(data)) + data
    raise ValueError(t)


PLAN_SSH = {
    "type": "plan",
    "session": "1f2e3d4c5b6a7988",
    "node_id": 1,
    "first_rank": 0,
    "total_backends": 4,
    "topology": "localhost:1 => localhost:2 ;",
    "backend": ["/bin/tool", "-v"],
    "env": [["A", "b"], ["OMP_NUM_THREADS", "4"]],
    "startup_timeout_ms": 30000,
    "attach_ms": 0,
    "allow_missing": True,
    "local_route": "tcp",
    "listen": "127.0.0.1",
    "remote_listen": "",
    "launcher": {
        "name": "ssh",
        "program": "ssh",
        "args": ["-o", "ProxyCommand=ssh -W %h:%p gw", "-o", "BatchMode=yes"],
        "connect_timeout_s": 10,
        "remote_path": "/opt/treecast/bin/treecast",
        "remote_prefix": "/usr/bin/wrap --with 'two words'",
    },
    "max_frame": 64 << 20,
    "log": "warn",
    "heartbeat_ms": 1000,
    "dead_after_ms": 30000,
    "rejoin_ms": 10000,
    "udp": [["TREECAST_UDP_FRAGMENT", "8000"], ["TREECAST_UDP_DROP", "0.05,7"]],
    "depth": 1,
    "filters": ["/opt/tool/libhistogram.so"],
    "max_control": 1 << 20,
    "clock": {"resync_ms": 60000, "probe_burst": 4, "probe_gap_us": 0, "distort": "seed:3,offset_us:500"},
    "zero_copy_min": 1 << 20,
    "stripes": 2,
    "mptcp": True,
    "stripe_stall_ms": 1500,
    "rails": ["10.1.0.0/16", "ib1"],
}

MEMBER_PLAN_SPAWNED = {
    "type": "member_plan",
    "node_id": 12,
    "rank": 7,
    "size": 16,
    "group": {"group": 2, "rank": 1, "size": 4},
    "heartbeat_ms": 250,
    "dead_after_ms": 1000,
    "rejoin_ms": 0,
    "clock": {"probes": 4294967295, "distort": "-200,5"},
    "zero_copy_min": 4294967295,
    "stripe_stall_ms": 4294967295,
}

MEMBER_PLAN_MINIMAL = {
    "type": "member_plan",
    "node_id": 0,
    "rank": 0,
    "size": 0,
    "heartbeat_ms": 0,
    "dead_after_ms": 0,
    "rejoin_ms": 4294967295,
}

PLAN_LOCAL = {
    "type": "plan",
    "session": "",
    "node_id": 0,
    "first_rank": 0,
    "total_backends": 1,
    "topology": "h:0 ;",
    "backend": [],
    "env": [],
    "startup_timeout_ms": 0,
    "attach_ms": 0,
    "allow_missing": False,
    "local_route": "unix",
    "listen": "",
    "remote_listen": "",
    "launcher": {"name": "local", "program": "", "args": [], "connect_timeout_s": 0, "remote_path": ""},
    "max_frame": 1,
    "log": "",
    "heartbeat_ms": 0,
    "dead_after_ms": 0,
    "rejoin_ms": 0,
    "max_control": 1,
}

PLAN_SLURM = {
    "type": "plan",
    "session": "s\u00e9ance-7",
    "node_id": 5,
    "first_rank": 4096,
    "total_backends": 2**32 - 1,
    "topology": "n1:0 => n2:0 n3:0 ;\nn2:0 => n2:1 ;",
    "backend": ["/usr/bin/env", "TOOL=a b", "tool"],
    "env": [["EMPTY", ""]],
    "startup_timeout_ms": 2**32 - 1,
    "attach_ms": 60000,
    "allow_missing": True,
    "local_route": "unix",
    "listen": "0.0.0.0",
    "remote_listen": "10.1.2.3:7000",
    "launcher": {
        "name": "slurm",
        "program": "srun",
        "args": ["--overlap", "--cpu-bind=none"],
        "connect_timeout_s": 30,
        "remote_path": "treecast",
    },
    "max_frame": 256 << 20,
    "log": "treecast=debug,info",
    "heartbeat_ms": 4294967295,
    "dead_after_ms": 1,
    "rejoin_ms": 4294967295,
    "max_control": 256 << 20,
}

WINDOW_UP = {"packets": 256, "bytes": str(1 << 20)}
WINDOW_DOWN = {"packets": 256, "bytes": str(8 << 20)}

NEW_STREAM = {
    "type": "new_stream",
    "id": 3,
    "ranks": "4-7",
    "sync": "timeout",
    "timeout_ms": 50,
    "up": {"name": "sum", "version": 1, "params_hex": ""},
    "down": {"name": "null", "version": 1, "params_hex": ""},
    "up_window": WINDOW_UP,
    "down_window": WINDOW_DOWN,
}

NEW_STREAM_PARAMS = {
    "type": "new_stream",
    "id": 9,
    "ranks": "0,2,4",
    "sync": "wait_for_all",
    "up": {
        "name": "histogram",
        "version": 2,
        "params_hex": (enc_value("%lf", 0.0) + enc_value("%lf", 100.0) + enc_value("%ud", 10)).hex(),
    },
    "down": {"name": "null", "version": 1, "params_hex": ""},
    "up_window": {"packets": 16, "bytes": str(64 << 10)},
    "down_window": {"packets": 1, "bytes": "1"},
    "program": 7,
}

CONTROL_CASES = [
    ("plan ssh with a spaced argument", PLAN_SSH),
    ("plan local minimal", PLAN_LOCAL),
    ("plan slurm attach", PLAN_SLURM),
    ("member plan of a spawned back-end", MEMBER_PLAN_SPAWNED),
    ("member plan minimal", MEMBER_PLAN_MINIMAL),
    ("join", {"type": "join", "ranks": "0-15,32", "commnodes": 5}),
    ("join empty", {"type": "join", "ranks": "", "commnodes": 1}),
    ("launch failed", {"type": "launch_failed", "message": "node 3 on h\u00f4te: exited 1"}),
    ("new stream", NEW_STREAM),
    ("new stream with filter params", NEW_STREAM_PARAMS),
    (
        "new stream plug-in filters",
        {
            "type": "new_stream",
            "id": 4294967295,
            "ranks": "0-4294967295",
            "sync": "do_not_wait",
            "up": {"name": "\u00e9" * 128, "version": 65535, "params_hex": "20030000000102ff"},
            "down": {"name": "libmine.so:down", "version": 0, "params_hex": ""},
            "up_window": {"packets": 4294967295, "bytes": str(U64_MAX)},
            "down_window": WINDOW_DOWN,
            "program": 4294967295,
            "route": "striped",
        },
    ),
    ("close stream", {"type": "close_stream", "id": 3}),
    ("leave failed", {"type": "leave", "ranks": "7", "reason": "link closed", "graceful": False}),
    ("leave graceful", {"type": "leave", "ranks": "0-3,8", "reason": "node 2: detached", "graceful": True}),
    ("filter error", {"type": "filter_error", "stream": 2, "rank": 1, "message": "bad"}),
    ("shutdown", {"type": "shutdown"}),
    ("attach points", {"type": "attach_points", "points": [[0, 3, "unix:@treecast-ab"], [1, 3, "10.0.0.1:4000"]]}),
    ("attach points empty", {"type": "attach_points", "points": []}),
    (
        "stream refused",
        {"type": "stream_refused", "stream": 4, "node": "comm node h:2", "message": "no filter named histogram"},
    ),
    ("clock probe", {"type": "clock_probe", "seq": 3, "sent_ns": 1763870000123456789}),
    ("clock reply negative", {"type": "clock_reply", "seq": 15, "sent_ns": -5, "child_ns": -9223372036854775808}),
    (
        "clock report",
        {
            "type": "clock_report",
            "samples": [
                {"node_id": 9, "offset_ns": -734250000, "error_ns": 1500, "rtt_ns": 3000, "drift_ppb": 87000,
                 "drift_error_ppb": 12, "measured_ns": 1763870000123456789},
                {"node_id": 10, "offset_ns": 5, "error_ns": 0, "rtt_ns": 0, "drift_ppb": -1,
                 "drift_error_ppb": 0, "measured_ns": 0},
            ],
        },
    ),
    ("clock report empty", {"type": "clock_report", "samples": []}),
    ("fallback", {"type": "fallback", "address": "unix:@treecast-5f3a-1", "further": []}),
    (
        "fallback with ancestors",
        {"type": "fallback", "address": "unix:@treecast-5f3a-1", "further": ["10.0.0.2:7000", "10.0.0.1:7000"]},
    ),
    ("fallback nowhere", {"type": "fallback", "address": "", "further": []}),
    (
        "rejoin",
        {"type": "rejoin", "ranks": "4-7", "commnodes": 1, "name": "comm node n2 (node 3)", "streams": [1, 4294967295]},
    ),
    ("rejoin back-end", {"type": "rejoin", "ranks": "9", "commnodes": 0, "name": "back-end rank 9", "streams": []}),
    (
        "orphaned",
        {"type": "orphaned", "node": "comm node n1 (node 2)", "ranks": "0-3", "reason": "front-end: link to comm node n1 (node 2) closed"},
    ),
    ("rejoined", {"type": "rejoined", "ranks": "0-1,3", "commnodes": 0, "parent": "front-end"}),
    (
        "link_clock",
        {"type": "link_clock", "offset_ns": -1999999000, "drift_ppb": 100000, "measured_ns": 1763900000000000000},
    ),
    ("monitor_start", {"type": "monitor_start", "program": 7}),
    ("monitor_stop", {"type": "monitor_stop"}),
    ("monitor_collect", {"type": "monitor_collect", "id": 3, "mode": "per_node", "limit_ms": 10000}),
    ("monitor_report", {"type": "monitor_report", "id": 3, "json": '{"reports":{},"missing":[]}'}),
    (
        "spawn",
        {
            "type": "spawn", "target": 2, "first_node_id": 21, "first_rank": 16, "count": 4, "size": 20,
            "group": 1, "group_first": 16, "group_size": 8, "command": ["/bin/worker", "--tile", "64"],
            "attach": False, "host": "n17", "light": True,
        },
    ),
    (
        "spawn default command",
        {
            "type": "spawn", "target": 0, "first_node_id": 5, "first_rank": 4, "count": 1, "size": 5,
            "group": 7, "group_first": 4, "group_size": 1, "command": [], "attach": True, "host": "", "light": False,
        },
    ),
    ("stop", {"type": "stop", "ranks": "16-19", "reason": "spawn 1 failed"}),
    ("spawn_request", {"type": "spawn_request", "id": 1, "rank": 5, "n": 4, "command": ["/bin/helper", "-q"]}),
    ("spawn_reply", {"type": "spawn_reply", "id": 1, "rank": 5, "group": 3, "ranks": "20-23", "error": ""}),
    ("set_params", {"type": "set_params", "stream": 3, "params_hex": "0602000000"}),
    ("filter_state", {"type": "filter_state", "stream": 3, "state_hex": "070500000000000000"}),
    ("set_down_params", {"type": "set_down_params", "stream": 4, "params_hex": "0503000000"}),
    (
        "filter_refused",
        {
            "type": "filter_refused",
            "sha256": hashlib.sha256(b"\x7fELF\x02\x01\x01").hexdigest(),
            "node": "comm node localhost (node 5)",
            "reason": "plug-in filter libpicky.so: the entry point returned no table",
        },
    ),
    (
        "load_filter",
        {
            "type": "load_filter",
            "label": "libhistogram.so",
            "sha256": hashlib.sha256(b"\x7fELF\x02\x01\x01").hexdigest(),
            "bytes_hex": "7f454c46020101",
        },
    ),
    (
        "spawn_reply failed",
        {"type": "spawn_reply", "id": 2, "rank": 5, "group": 0, "ranks": "", "error": "rank 24: no such program"},
    ),
]


def gen_control():
    return [{"name": n, "msg": m, "hex": enc_control(m).hex()} for n, m in CONTROL_CASES]


def hdr(kind=1, length=0, version=PROTOCOL_VERSION, tag=0):
    return struct.pack("<BBHIiIQI", version, kind, 0, 1, tag, 0, 0, length)


def with_(base, **changes):
    """A copy of a message with some fields changed; `launcher__name="x"` reaches into nested dicts."""
    m = json.loads(json.dumps(base))
    for key, value in changes.items():
        d = m
        *path, last = key.split("__")
        for p in path:
            d = d[p]
        d[last] = value
    return m


def replace_once(data, old, new):
    """`data` with its only occurrence of `old` replaced by `new`."""
    assert data.count(old) == 1, (data.hex(), old.hex())
    return data.replace(old, new)


def stream_bytes(m):
    return bytes([4]) + enc_stream(m)


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
    # batch: decode_batch (and FrameDecoder)
    ("batch", "version 1 header", hdr(version=1), "BadVersion"),
    ("batch", "version 1 credit frame", hdr(kind=3, version=1, tag=64), "BadVersion"),
    ("batch", "version 0", hdr(version=0), "BadVersion"),
    ("batch", "version 3 header (an older build)", hdr(version=3), "BadVersion"),
    ("batch", "version 5 header (an older build)", hdr(version=5), "BadVersion"),
    ("batch", "version 6 header (an older build)", hdr(version=6), "BadVersion"),
    ("batch", "version 7 header (an older build)", hdr(version=7), "BadVersion"),
    ("batch", "version 8 header (an older build)", hdr(version=8), "BadVersion"),
    ("batch", "version 9 header (an older build)", hdr(version=9), "BadVersion"),
    ("batch", "version 10 header (an older build)", hdr(version=10), "BadVersion"),
    ("batch", "version 12", hdr(version=12), "BadVersion"),
    ("batch", "unknown kind", hdr(kind=6), "UnknownKind"),
    ("batch", "kind zero", hdr(kind=0), "UnknownKind"),
    ("batch", "payload over 256 MiB", hdr(length=(256 << 20) + 1), "TooLong"),
    ("batch", "truncated header", hdr()[:27], "Truncated"),
    ("batch", "truncated payload", hdr(length=4) + b"\x01\x02", "Truncated"),
    ("batch", "trailing partial frame", hdr() + bytes([PROTOCOL_VERSION]), "Truncated"),
    ("batch", "trailing partial header", hdr() + hdr(kind=3, length=12)[:20], "Truncated"),
    ("batch", "trailing version 1 byte", hdr() + bytes([1]), "BadVersion"),
    # grant: one whole credit frame (decode_batch accepts it), then Frame::grant
    ("grant", "credit without payload", hdr(kind=3), "Truncated"),
    ("grant", "credit with packets only", hdr(kind=3, length=4) + u32(1), "Truncated"),
    ("grant", "credit one byte short", hdr(kind=3, length=11) + enc_grant(1, 1)[:11], "Truncated"),
    ("grant", "credit with a trailing byte", hdr(kind=3, length=13) + enc_grant(1, 1) + b"\x00", "TrailingBytes"),
    # control: ControlMsg::decode
    ("control", "empty", b"", "Truncated"),
    ("control", "unknown tag", bytes([0xEE]), "UnknownControl"),
    ("control", "tag zero", bytes([0]), "UnknownControl"),
    ("control", "tag after the last", bytes([33]), "UnknownControl"),
    ("control", "clock probe without its time", bytes([11]) + u32(1), "Truncated"),
    ("control", "clock report announcing more samples than it has", bytes([13]) + u32(2) + bytes(52), "TooLong"),
    ("control", "shutdown with trailing byte", bytes([8, 0]), "TrailingBytes"),
    ("control", "close stream truncated", bytes([5, 1, 0]), "Truncated"),
    ("control", "ranks unsorted", bytes([2]) + u32(2) + u32(5) + u32(6) + u32(0) + u32(1) + u32(1), "Invalid"),
    ("control", "ranks adjacent", bytes([2]) + u32(2) + u32(0) + u32(1) + u32(2) + u32(3) + u32(1), "Invalid"),
    ("control", "range reversed", bytes([2]) + u32(1) + u32(3) + u32(1) + u32(1), "Invalid"),
    ("control", "bad utf8 message", bytes([3]) + u32(1) + b"\x80", "InvalidUtf8"),
    # plan
    ("control", "plan version 4 (an older build)", bytes([1]) + enc_plan(PLAN_SSH, version=4), "Invalid"),
    ("control", "plan version 5 (before the control frame limit and the clock settings)", bytes([1]) + enc_plan(PLAN_SSH, version=5), "Invalid"),
    ("control", "plan version 6 (before the zero-copy threshold)", bytes([1]) + enc_plan(PLAN_SSH, version=6), "Invalid"),
    ("control", "plan version 7 (before the connections per link, Multipath TCP and the remote prefix)", bytes([1]) + enc_plan(PLAN_SSH, version=7), "Invalid"),
    ("control", "plan version 8 (before the remote prefix)", bytes([1]) + enc_plan(PLAN_SSH, version=8), "Invalid"),
    ("control", "plan version 9 (before the stripe stall limit)", bytes([1]) + enc_plan(PLAN_SSH, version=9), "Invalid"),
    ("control", "plan version 10 (before the launcher by name)", bytes([1]) + enc_plan(PLAN_SSH, version=10), "Invalid"),
    ("control", "plan version 11 (before the rails)", bytes([1]) + enc_plan(PLAN_SSH, version=11), "Invalid"),
    ("control", "plan version 13", bytes([1]) + enc_plan(PLAN_SSH, version=13), "Invalid"),
    ("control", "plan version 0", bytes([1]) + enc_plan(PLAN_LOCAL, version=0), "Invalid"),
    ("control", "plan with only its version", bytes([1]) + u16(PLAN_VERSION), "Truncated"),
    ("control", "plan cut inside its version", bytes([1, PLAN_VERSION]), "Truncated"),
    # The plan ends with the control frame limit (4 bytes), the clock settings (24
    # bytes when none is set), the zero-copy threshold (4), the connections per link (1),
    # the Multipath TCP flag (1), the remote prefix (4 when empty) and the stripe
    # stall limit (4).
    ("control", "plan without its plug-in list", bytes([1]) + enc_plan(PLAN_LOCAL)[:-47], "Truncated"),
    ("control", "plan without its control frame limit", bytes([1]) + enc_plan(PLAN_LOCAL)[:-43], "Truncated"),
    ("control", "plan cut inside its clock settings", bytes([1]) + enc_plan(PLAN_LOCAL)[:-19], "Truncated"),
    ("control", "plan clock flag 2", bytes([1]) + enc_plan(PLAN_LOCAL)[:-42] + bytes([2]) + enc_plan(PLAN_LOCAL)[-41:], "Invalid"),
    ("control", "plan cut inside its zero-copy threshold", bytes([1]) + enc_plan(PLAN_LOCAL)[:-15], "Truncated"),
    ("control", "plan without its connections per link", bytes([1]) + enc_plan(PLAN_LOCAL)[:-14], "Truncated"),
    ("control", "plan with 17 connections per link", bytes([1]) + enc_plan(PLAN_LOCAL)[:-14] + bytes([17]) + enc_plan(PLAN_LOCAL)[-13:], "Invalid"),
    ("control", "plan without its Multipath TCP flag", bytes([1]) + enc_plan(PLAN_LOCAL)[:-13], "Truncated"),
    ("control", "plan Multipath TCP flag 2", bytes([1]) + enc_plan(PLAN_LOCAL)[:-13] + bytes([2]) + enc_plan(PLAN_LOCAL)[-12:], "Invalid"),
    ("control", "plan cut inside its remote prefix", bytes([1]) + enc_plan(PLAN_LOCAL)[:-9], "Truncated"),
    ("control", "plan cut inside its stripe stall limit", bytes([1]) + enc_plan(PLAN_LOCAL)[:-5], "Truncated"),
    ("control", "plan without its rails", bytes([1]) + enc_plan(PLAN_LOCAL)[:-4], "Truncated"),
    ("control", "plan with 17 rails", bytes([1]) + enc_plan(PLAN_LOCAL)[:-4] + enc_strings(["ib0"] * 17), "Invalid"),
    ("control", "plan with an empty rail", bytes([1]) + enc_plan(PLAN_LOCAL)[:-4] + enc_strings(["ib0", ""]), "Invalid"),
    # member plan
    ("control", "member plan version 1 (before the zero-copy threshold)", bytes([32]) + enc_member_plan(MEMBER_PLAN_SPAWNED, version=1), "Invalid"),
    ("control", "member plan version 2 (before the stripe stall limit)", bytes([32]) + enc_member_plan(MEMBER_PLAN_SPAWNED, version=2), "Invalid"),
    ("control", "member plan version 4", bytes([32]) + enc_member_plan(MEMBER_PLAN_SPAWNED, version=4), "Invalid"),
    ("control", "member plan version 0", bytes([32]) + enc_member_plan(MEMBER_PLAN_MINIMAL, version=0), "Invalid"),
    ("control", "member plan cut inside its version", bytes([32, MEMBER_PLAN_VERSION]), "Truncated"),
    ("control", "member plan without its clock", bytes([32]) + enc_member_plan(MEMBER_PLAN_MINIMAL)[:-32], "Truncated"),
    ("control", "member plan without its zero-copy threshold", bytes([32]) + enc_member_plan(MEMBER_PLAN_MINIMAL)[:-8], "Truncated"),
    ("control", "member plan cut inside its stripe stall limit", bytes([32]) + enc_member_plan(MEMBER_PLAN_MINIMAL)[:-1], "Truncated"),
    ("control", "member plan trailing byte", bytes([32]) + enc_member_plan(MEMBER_PLAN_MINIMAL) + b"\x00", "TrailingBytes"),
    (
        "control",
        "member plan group flag 2",
        # The flag follows the version and three u32s.
        bytes([32]) + enc_member_plan(MEMBER_PLAN_MINIMAL)[:14] + bytes([2]) + enc_member_plan(MEMBER_PLAN_MINIMAL)[15:],
        "Invalid",
    ),
    ("control", "plan trailing byte", bytes([1]) + enc_plan(PLAN_LOCAL) + b"\x00", "TrailingBytes"),
    ("control", "plan allow missing 2", bytes([1]) + enc_plan(with_(PLAN_LOCAL, allow_missing=2)), "Invalid"),
    ("control", "plan local route 2", bytes([1]) + enc_plan(with_(PLAN_SSH, local_route=2)), "Invalid"),
    ("control", "plan with an empty launcher name", bytes([1]) + enc_plan(with_(PLAN_SSH, launcher__name="")), "Invalid"),
    ("control", "plan with a launcher name of 65 bytes", bytes([1]) + enc_plan(with_(PLAN_SSH, launcher__name="x" * 65)), "Invalid"),
    ("control", "plan largest frame 0", bytes([1]) + enc_plan(with_(PLAN_SSH, max_frame=0)), "Invalid"),
    ("control", "plan largest frame over 256 MiB", bytes([1]) + enc_plan(with_(PLAN_SSH, max_frame=(256 << 20) + 1)), "Invalid"),
    ("control", "plan largest control frame 0", bytes([1]) + enc_plan(with_(PLAN_SSH, max_control=0)), "Invalid"),
    ("control", "plan largest control frame over 256 MiB", bytes([1]) + enc_plan(with_(PLAN_SSH, max_control=(256 << 20) + 1)), "Invalid"),
    (
        "control",
        "plan hostile argument count",
        bytes([1]) + replace_once(enc_plan(PLAN_SSH), u32(4) + enc_str("-o"), u32(0xFFFFFFFF) + enc_str("-o")),
        "TooLong",
    ),
    (
        "control",
        "plan bad utf8 launcher argument",
        bytes([1])
        + replace_once(enc_plan(PLAN_SSH), enc_str("ProxyCommand=ssh -W %h:%p gw"), enc_bytes_str(b"Proxy\xff")),
        "InvalidUtf8",
    ),
    (
        "control",
        "v1 Subtree layout",
        # The string's length is read as the plan version: it must not be a current one.
        bytes([1]) + enc_str("host:0 ;") + u32(0) * 3 + u32(0) + u32(0) + u32(0),
        "Invalid",
    ),
    # new stream
    (
        "control",
        "unknown sync mode",
        replace_once(stream_bytes(NEW_STREAM), bytes([1]) + u32(50), bytes([3]) + u32(50)),
        "Invalid",
    ),
    (
        "control",
        "v1 NewStream layout",
        bytes([4]) + u32(1) + enc_ranks("0") + bytes([0]) + u32(0) + bytes([1, 0]),
        "Truncated",
    ),
    ("control", "empty up filter name", stream_bytes(with_(NEW_STREAM, up__name="")), "Invalid"),
    ("control", "257-byte filter name", stream_bytes(with_(NEW_STREAM, down__name="\u00e9" * 128 + "x")), "Invalid"),
    (
        "control",
        "filter params longer than the message",
        bytes([4]) + u32(1) + enc_ranks("0") + bytes([0]) + u32(0) + enc_str("sum") + u16(1) + u32(100) + b"\x05",
        "TooLong",
    ),
    ("control", "zero up window packets", stream_bytes(with_(NEW_STREAM, up_window__packets=0)), "Invalid"),
    ("control", "zero up window bytes", stream_bytes(with_(NEW_STREAM, up_window__bytes="0")), "Invalid"),
    ("control", "zero down window", stream_bytes(with_(NEW_STREAM, down_window={"packets": 0, "bytes": "0"})), "Invalid"),
    ("control", "down window truncated", stream_bytes(NEW_STREAM)[:-13], "Truncated"),
    ("control", "program tag truncated", stream_bytes(NEW_STREAM)[:-2], "Truncated"),
    ("control", "new stream of version 2 (no program tag)", stream_bytes(NEW_STREAM)[:-5], "Truncated"),
    ("control", "new stream of version 9 (no route)", stream_bytes(NEW_STREAM)[:-1], "Truncated"),
    ("control", "unknown stream route", stream_bytes(NEW_STREAM)[:-1] + b"\x04", "Invalid"),
    ("control", "new stream with a trailing byte", stream_bytes(NEW_STREAM) + b"\x00", "TrailingBytes"),
    # leave
    (
        "control",
        "leave graceful 2",
        enc_control({"type": "leave", "ranks": "7", "reason": "x", "graceful": 2}),
        "Invalid",
    ),
    (
        "control",
        "leave graceful 255",
        enc_control({"type": "leave", "ranks": "7", "reason": "x", "graceful": 255}),
        "Invalid",
    ),
    ("control", "v1 RanksLost layout", bytes([6]) + enc_ranks("7") + enc_str("link closed"), "Truncated"),
    # attach points, stream refused
    ("control", "attach points hostile count", bytes([9]) + u32(0xFFFFFFFF) + b"\x00" * 12, "TooLong"),
    ("control", "stream refused without message", bytes([10]) + u32(4) + enc_str("n"), "Truncated"),
    (
        "control",
        "stream refused bad utf8 node",
        bytes([10]) + u32(4) + enc_bytes_str(b"\xc0\xaf") + enc_str(""),
        "InvalidUtf8",
    ),
    ("control", "unknown collect mode", bytes([21]) + u32(3) + bytes([3]) + u32(0), "Invalid"),
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
