//! Checks the codec against the language-neutral vectors in `testdata/wire/`.
//!
//! The vectors are written by `testdata/wire/gen_vectors.py`, an independent
//! encoder, so these tests pin the byte layout of `docs/wire-format.md`.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use serde_json::Value as Json;
use treecast_wire::{
    cut_frames, decode_batch, decode_collective, decode_values, encode_batch, encode_collective,
    encode_values, AttachPoint, ClockPlan, ClockSample, CollectMode, ControlMsg, CutError, DecodeError,
    FilterSpec, Format, Frame, FrameHeader, FrameKind, Grant, GroupPlace, LaunchPlan, LauncherSpec,
    LocalRoute, MemberPlan, RankSet, RouteChoice, ScalarType, SpawnOrder, StreamSpec, SyncMode, Value,
    ValueType, Window, FLAG_PAYLOAD_FD, FLAG_PEER_COLL, HEADER_LEN, MAX_PAYLOAD_LEN, PROTOCOL_VERSION,
};

fn load(name: &str) -> Vec<Json> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/wire").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match serde_json::from_str(&text).unwrap() {
        Json::Array(cases) => cases,
        other => panic!("{name} is not a JSON array: {other}"),
    }
}

fn str_of<'a>(case: &'a Json, key: &str) -> &'a str {
    case[key].as_str().unwrap_or_else(|| panic!("{key} is not a string in {case}"))
}

fn u32_of(case: &Json, key: &str) -> u32 {
    u32::try_from(case[key].as_u64().unwrap_or_else(|| panic!("{key} in {case}"))).unwrap()
}

fn u64_of(case: &Json, key: &str) -> u64 {
    str_of(case, key).parse().unwrap_or_else(|e| panic!("{key} in {case}: {e}"))
}

fn bool_of(case: &Json, key: &str) -> bool {
    case[key].as_bool().unwrap_or_else(|| panic!("{key} is not a bool in {case}"))
}

fn unhex(case: &Json, key: &str) -> Vec<u8> {
    hex::decode(str_of(case, key)).unwrap()
}

/// One scalar from its JSON form: numbers, 64-bit integers as decimal strings, strings.
fn scalar(t: ScalarType, v: &Json) -> Value {
    let int = || v.as_i64().unwrap_or_else(|| panic!("{v} is not an integer"));
    match t {
        ScalarType::Char => Value::Char(int().try_into().unwrap()),
        ScalarType::UChar => Value::UChar(int().try_into().unwrap()),
        ScalarType::Short => Value::Short(int().try_into().unwrap()),
        ScalarType::UShort => Value::UShort(int().try_into().unwrap()),
        ScalarType::Int => Value::Int(int().try_into().unwrap()),
        ScalarType::UInt => Value::UInt(int().try_into().unwrap()),
        ScalarType::Long => Value::Long(v.as_str().unwrap().parse().unwrap()),
        ScalarType::ULong => Value::ULong(v.as_str().unwrap().parse().unwrap()),
        ScalarType::Float => {
            let x = v.as_f64().unwrap();
            assert_eq!(f64::from(x as f32), x, "{x} is not exact in f32");
            Value::Float(x as f32)
        }
        ScalarType::Double => Value::Double(v.as_f64().unwrap()),
        ScalarType::Str => Value::Str(v.as_str().unwrap().to_owned()),
    }
}

macro_rules! collect {
    ($elems:expr, $scalar:ident => $array:ident) => {
        Value::$array(
            $elems
                .into_iter()
                .map(|e| match e {
                    Value::$scalar(x) => x,
                    other => unreachable!("{other:?}"),
                })
                .collect(),
        )
    };
}

/// A value from `{"type": "%ad", "value": [...]}`.
fn value_from_json(v: &Json) -> Value {
    let spec = str_of(v, "type");
    let format = Format::parse(spec).unwrap();
    assert_eq!(format.len(), 1, "{spec}");
    let data = &v["value"];
    match format.types[0] {
        ValueType::Scalar(t) => scalar(t, data),
        ValueType::Bytes => Value::Bytes(hex::decode(data.as_str().unwrap()).unwrap()),
        ValueType::Array(t) => {
            let elems: Vec<Value> = data.as_array().unwrap().iter().map(|e| scalar(t, e)).collect();
            match t {
                ScalarType::Char => collect!(elems, Char => CharArray),
                ScalarType::UChar => collect!(elems, UChar => UCharArray),
                ScalarType::Short => collect!(elems, Short => ShortArray),
                ScalarType::UShort => collect!(elems, UShort => UShortArray),
                ScalarType::Int => collect!(elems, Int => IntArray),
                ScalarType::UInt => collect!(elems, UInt => UIntArray),
                ScalarType::Long => collect!(elems, Long => LongArray),
                ScalarType::ULong => collect!(elems, ULong => ULongArray),
                ScalarType::Float => collect!(elems, Float => FloatArray),
                ScalarType::Double => collect!(elems, Double => DoubleArray),
                ScalarType::Str => collect!(elems, Str => StrArray),
            }
        }
    }
}

#[test]
fn value_vectors() {
    let cases = load("values.json");
    assert!(cases.len() >= 30);
    let mut specs_seen = std::collections::HashSet::new();
    for case in &cases {
        let name = str_of(case, "name");
        let values: Vec<Value> = case["values"].as_array().unwrap().iter().map(value_from_json).collect();
        let wire = unhex(case, "hex");

        let mut out = Vec::new();
        encode_values(&values, &mut out);
        assert_eq!(hex::encode(&out), hex::encode(&wire), "encoding of {name}");
        assert_eq!(decode_values(&wire).unwrap(), values, "decoding of {name}");

        let format = Format::parse(str_of(case, "format")).unwrap();
        assert_eq!(format, Format::of(&values), "format of {name}");
        format.check(&values).unwrap();
        assert_eq!(Format::parse(&format.to_string()).unwrap(), format, "canonical format of {name}");
        specs_seen.extend(values.iter().map(Value::spec));
    }
    // Every specifier, scalar and array, and %b appear in some vector.
    for t in ScalarType::ALL {
        assert!(specs_seen.contains(ValueType::Scalar(t).spec()), "no vector for {t}");
        assert!(specs_seen.contains(ValueType::Array(t).spec()), "no vector for %a{}", t.letters());
    }
    assert!(specs_seen.contains("%b"));
}

fn frame_from_json(case: &Json) -> Frame {
    let kind = match str_of(case, "kind") {
        "data" => FrameKind::Data,
        "control" => FrameKind::Control,
        "credit" => FrameKind::Credit,
        "peer" => FrameKind::Peer,
        other => panic!("unknown kind {other}"),
    };
    let header = FrameHeader {
        kind,
        flags: u16::try_from(u32_of(case, "flags")).unwrap(),
        stream: u32_of(case, "stream"),
        tag: i32::try_from(case["tag"].as_i64().unwrap()).unwrap(),
        rank: u32_of(case, "rank"),
        timestamp_ns: str_of(case, "timestamp_ns").parse().unwrap(),
    };
    Frame::new(header, unhex(case, "payload_hex"))
}

#[test]
fn frame_vectors() {
    let cases = load("frames.json");
    let mut frames = Vec::new();
    let mut all = Vec::new();
    // The frames a byte stream can carry (no payload file claimed), and their bytes.
    let (mut on_streams, mut streamed) = (Vec::new(), Vec::new());
    let mut credits = 0;
    let mut collectives = 0;
    for case in &cases {
        let name = str_of(case, "name");
        let frame = frame_from_json(case);
        let wire = unhex(case, "hex");
        assert_eq!(wire[0], PROTOCOL_VERSION, "{name}");
        assert_eq!(hex::encode(encode_batch(std::slice::from_ref(&frame))), hex::encode(&wire), "{name}");
        assert_eq!(
            FrameHeader::decode(&wire[..HEADER_LEN]).unwrap(),
            (frame.header, frame.payload.len()),
            "{name}"
        );
        assert_eq!(decode_batch(Bytes::from(wire.clone())).unwrap(), vec![frame.clone()], "{name}");
        if frame.header.kind == FrameKind::Credit {
            // A credit frame built from its grant is the same frame, and gives the grant back.
            let grant = &case["grant"];
            let grant = Grant { packets: u32_of(grant, "packets"), bytes: u64_of(grant, "bytes") };
            assert_eq!(Frame::credit(frame.header.stream, grant), frame, "{name}");
            assert_eq!(frame.grant().unwrap(), grant, "{name}");
            credits += 1;
        }
        if frame.header.kind == FrameKind::Peer && frame.header.flags & FLAG_PEER_COLL != 0 {
            // A collective's head decodes and re-encodes to the bytes it came from.
            let (head, at) = decode_collective(&frame.payload).unwrap();
            assert_eq!(encode_collective(&head, &frame.payload[at..]), frame.payload.to_vec(), "{name}");
            collectives += 1;
        }
        all.extend_from_slice(&wire);
        if frame.header.flags & FLAG_PAYLOAD_FD == 0 {
            streamed.extend_from_slice(&wire);
            on_streams.push(frame.clone());
        } else {
            // A byte stream carries no payload files: the cutter refuses the claim.
            let cut = cut_frames(&mut BytesMut::from(&wire[..]), MAX_PAYLOAD_LEN);
            assert_eq!(cut, Err(CutError::NoFile), "{name}");
        }
        frames.push(frame);
    }
    assert!(credits > 0, "no credit frame vector");
    assert!(collectives > 0, "no collective frame vector");
    assert_eq!(decode_batch(Bytes::from(all.clone())).unwrap(), frames);
    // The cutter every link runs, fed the same bytes a few at a time.
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in streamed.chunks(5) {
        buf.extend_from_slice(chunk);
        out.extend(cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap());
    }
    assert_eq!(out, on_streams);
    assert!(buf.is_empty());
}

fn ranks(case: &Json) -> RankSet {
    str_of(case, "ranks").parse().unwrap()
}

fn strings_of(case: &Json, key: &str) -> Vec<String> {
    case[key].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect()
}

fn plan_from_json(m: &Json) -> LaunchPlan {
    let launcher = &m["launcher"];
    LaunchPlan {
        session: str_of(m, "session").to_owned(),
        node_id: u32_of(m, "node_id"),
        first_rank: u32_of(m, "first_rank"),
        total_backends: u32_of(m, "total_backends"),
        topology: str_of(m, "topology").to_owned(),
        backend: strings_of(m, "backend"),
        env: m["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|kv| (kv[0].as_str().unwrap().to_owned(), kv[1].as_str().unwrap().to_owned()))
            .collect(),
        startup_timeout_ms: u32_of(m, "startup_timeout_ms"),
        attach_ms: u32_of(m, "attach_ms"),
        allow_missing: bool_of(m, "allow_missing"),
        local_route: match str_of(m, "local_route") {
            "unix" => LocalRoute::Unix,
            "tcp" => LocalRoute::Tcp,
            other => panic!("local route {other}"),
        },
        listen: str_of(m, "listen").to_owned(),
        remote_listen: str_of(m, "remote_listen").to_owned(),
        launcher: LauncherSpec {
            name: str_of(launcher, "name").to_owned(),
            program: str_of(launcher, "program").to_owned(),
            args: strings_of(launcher, "args"),
            connect_timeout_s: u32_of(launcher, "connect_timeout_s"),
            remote_path: str_of(launcher, "remote_path").to_owned(),
            remote_prefix: launcher.get("remote_prefix").and_then(Json::as_str).unwrap_or("").to_owned(),
        },
        max_frame: u32_of(m, "max_frame"),
        log: str_of(m, "log").to_owned(),
        heartbeat_ms: u32_of(m, "heartbeat_ms"),
        dead_after_ms: u32_of(m, "dead_after_ms"),
        rejoin_ms: u32_of(m, "rejoin_ms"),
        udp: m.get("udp").map(|pairs| {
            pairs
                .as_array()
                .unwrap()
                .iter()
                .map(|kv| (kv[0].as_str().unwrap().to_owned(), kv[1].as_str().unwrap().to_owned()))
                .collect()
        }),
        depth: m.get("depth").map_or(0, |d| d.as_u64().unwrap() as u32),
        filters: m.get("filters").map_or_else(Vec::new, |_| strings_of(m, "filters")),
        max_control: u32_of(m, "max_control"),
        clock: clock_from_json(m),
        zero_copy_min: m.get("zero_copy_min").map_or(0, |v| u32::try_from(v.as_u64().unwrap()).unwrap()),
        stripes: m.get("stripes").map_or(0, |v| u8::try_from(v.as_u64().unwrap()).unwrap()),
        mptcp: m.get("mptcp").is_some_and(|v| v.as_bool().unwrap()),
        stripe_stall_ms: m.get("stripe_stall_ms").map_or(0, |v| u32::try_from(v.as_u64().unwrap()).unwrap()),
        rails: m.get("rails").map_or_else(Vec::new, |_| strings_of(m, "rails")),
    }
}

fn clock_from_json(m: &Json) -> ClockPlan {
    let Some(c) = m.get("clock") else { return ClockPlan::default() };
    let field = |k: &str| c.get(k).map(|v| u32::try_from(v.as_u64().unwrap()).unwrap());
    ClockPlan {
        resync_ms: field("resync_ms"),
        probes: field("probes"),
        probe_burst: field("probe_burst"),
        probe_gap_us: field("probe_gap_us"),
        distort: c.get("distort").map_or("", |d| d.as_str().unwrap()).to_owned(),
    }
}

fn member_plan_from_json(m: &Json) -> MemberPlan {
    MemberPlan {
        node_id: u32_of(m, "node_id"),
        rank: u32_of(m, "rank"),
        size: u32_of(m, "size"),
        group: m.get("group").map(|g| GroupPlace {
            group: u32_of(g, "group"),
            rank: u32_of(g, "rank"),
            size: u32_of(g, "size"),
        }),
        heartbeat_ms: u32_of(m, "heartbeat_ms"),
        dead_after_ms: u32_of(m, "dead_after_ms"),
        rejoin_ms: u32_of(m, "rejoin_ms"),
        clock: clock_from_json(m),
        zero_copy_min: m.get("zero_copy_min").map_or(0, |v| u32::try_from(v.as_u64().unwrap()).unwrap()),
        stripe_stall_ms: m.get("stripe_stall_ms").map_or(0, |v| u32::try_from(v.as_u64().unwrap()).unwrap()),
    }
}

fn filter_from_json(f: &Json) -> FilterSpec {
    FilterSpec {
        name: str_of(f, "name").to_owned(),
        version: u16::try_from(u32_of(f, "version")).unwrap(),
        params: unhex(f, "params_hex"),
    }
}

fn window_from_json(w: &Json) -> Window {
    Window { packets: u32_of(w, "packets"), bytes: u64_of(w, "bytes") }
}

fn stream_from_json(m: &Json) -> StreamSpec {
    StreamSpec {
        id: u32_of(m, "id"),
        ranks: ranks(m),
        sync: match str_of(m, "sync") {
            "wait_for_all" => SyncMode::WaitForAll,
            "timeout" => SyncMode::TimeOut(u32_of(m, "timeout_ms")),
            "do_not_wait" => SyncMode::DoNotWait,
            other => panic!("sync {other}"),
        },
        up: filter_from_json(&m["up"]),
        down: filter_from_json(&m["down"]),
        up_window: window_from_json(&m["up_window"]),
        down_window: window_from_json(&m["down_window"]),
        program: m.get("program").map_or(0, |_| u32_of(m, "program")),
        route: m.get("route").map_or(RouteChoice::Network, |_| str_of(m, "route").parse().unwrap()),
    }
}

fn control_from_json(m: &Json) -> ControlMsg {
    match str_of(m, "type") {
        "plan" => ControlMsg::Plan(Box::new(plan_from_json(m))),
        "member_plan" => ControlMsg::MemberPlan(Box::new(member_plan_from_json(m))),
        "join" => ControlMsg::Join { ranks: ranks(m), commnodes: u32_of(m, "commnodes") },
        "launch_failed" => ControlMsg::LaunchFailed { message: str_of(m, "message").to_owned() },
        "new_stream" => ControlMsg::NewStream(stream_from_json(m)),
        "close_stream" => ControlMsg::CloseStream { id: u32_of(m, "id") },
        "leave" => ControlMsg::Leave {
            ranks: ranks(m),
            reason: str_of(m, "reason").to_owned(),
            graceful: bool_of(m, "graceful"),
        },
        "filter_error" => ControlMsg::FilterError {
            stream: u32_of(m, "stream"),
            rank: u32_of(m, "rank"),
            message: str_of(m, "message").to_owned(),
        },
        "shutdown" => ControlMsg::Shutdown,
        "attach_points" => ControlMsg::AttachPoints {
            points: m["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| AttachPoint {
                    rank: u32::try_from(p[0].as_u64().unwrap()).unwrap(),
                    node_id: u32::try_from(p[1].as_u64().unwrap()).unwrap(),
                    address: p[2].as_str().unwrap().to_owned(),
                })
                .collect(),
        },
        "stream_refused" => ControlMsg::StreamRefused {
            stream: u32_of(m, "stream"),
            node: str_of(m, "node").to_owned(),
            message: str_of(m, "message").to_owned(),
        },
        "clock_probe" => {
            ControlMsg::ClockProbe { seq: u32_of(m, "seq"), sent_ns: m["sent_ns"].as_i64().unwrap() }
        }
        "clock_reply" => ControlMsg::ClockReply {
            seq: u32_of(m, "seq"),
            sent_ns: m["sent_ns"].as_i64().unwrap(),
            child_ns: m["child_ns"].as_i64().unwrap(),
        },
        "clock_report" => ControlMsg::ClockReport {
            samples: m["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| ClockSample {
                    node_id: u32_of(s, "node_id"),
                    offset_ns: s["offset_ns"].as_i64().unwrap(),
                    error_ns: s["error_ns"].as_u64().unwrap(),
                    rtt_ns: s["rtt_ns"].as_u64().unwrap(),
                    drift_ppb: s["drift_ppb"].as_i64().unwrap(),
                    drift_error_ppb: s["drift_error_ppb"].as_u64().unwrap(),
                    measured_ns: s["measured_ns"].as_i64().unwrap(),
                })
                .collect(),
        },
        "fallback" => ControlMsg::Fallback {
            address: str_of(m, "address").to_owned(),
            further: m["further"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect(),
        },
        "rejoin" => ControlMsg::Rejoin {
            ranks: ranks(m),
            commnodes: u32_of(m, "commnodes"),
            name: str_of(m, "name").to_owned(),
            streams: m["streams"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
                .collect(),
        },
        "orphaned" => ControlMsg::Orphaned {
            node: str_of(m, "node").to_owned(),
            ranks: ranks(m),
            reason: str_of(m, "reason").to_owned(),
        },
        "monitor_start" => ControlMsg::MonitorStart { program: u32_of(m, "program") },
        "spawn" => ControlMsg::Spawn(SpawnOrder {
            target: u32_of(m, "target"),
            first_node_id: u32_of(m, "first_node_id"),
            first_rank: u32_of(m, "first_rank"),
            count: u32_of(m, "count"),
            size: u32_of(m, "size"),
            group: u32_of(m, "group"),
            group_first: u32_of(m, "group_first"),
            group_size: u32_of(m, "group_size"),
            command: strings_of(m, "command"),
            attach: bool_of(m, "attach"),
            host: str_of(m, "host").to_owned(),
            light: bool_of(m, "light"),
        }),
        "stop" => ControlMsg::Stop { ranks: ranks(m), reason: str_of(m, "reason").to_owned() },
        "spawn_request" => ControlMsg::SpawnRequest {
            id: u32_of(m, "id"),
            rank: u32_of(m, "rank"),
            n: u32_of(m, "n"),
            command: strings_of(m, "command"),
        },
        "spawn_reply" => ControlMsg::SpawnReply {
            id: u32_of(m, "id"),
            rank: u32_of(m, "rank"),
            group: u32_of(m, "group"),
            ranks: ranks(m),
            error: str_of(m, "error").to_owned(),
        },
        "set_params" => ControlMsg::SetParams {
            stream: u32_of(m, "stream"),
            params: hex::decode(str_of(m, "params_hex")).unwrap(),
        },
        "filter_state" => ControlMsg::FilterState {
            stream: u32_of(m, "stream"),
            state: hex::decode(str_of(m, "state_hex")).unwrap(),
        },
        "set_down_params" => ControlMsg::SetDownParams {
            stream: u32_of(m, "stream"),
            params: hex::decode(str_of(m, "params_hex")).unwrap(),
        },
        "filter_refused" => ControlMsg::FilterRefused {
            sha256: hex::decode(str_of(m, "sha256")).unwrap().try_into().unwrap(),
            node: str_of(m, "node").to_owned(),
            reason: str_of(m, "reason").to_owned(),
        },
        "load_filter" => ControlMsg::LoadFilter {
            label: str_of(m, "label").to_owned(),
            sha256: hex::decode(str_of(m, "sha256")).unwrap().try_into().unwrap(),
            bytes: hex::decode(str_of(m, "bytes_hex")).unwrap(),
        },
        "monitor_stop" => ControlMsg::MonitorStop,
        "monitor_collect" => ControlMsg::MonitorCollect {
            id: u32_of(m, "id"),
            mode: match str_of(m, "mode") {
                "merged" => CollectMode::Merged,
                "per_node" => CollectMode::PerNode,
                "confirm" => CollectMode::Confirm,
                other => panic!("unknown collect mode {other}"),
            },
            limit_ms: u32_of(m, "limit_ms"),
        },
        "monitor_report" => {
            ControlMsg::MonitorReport { id: u32_of(m, "id"), json: str_of(m, "json").to_owned() }
        }
        "link_clock" => ControlMsg::LinkClock {
            offset_ns: m["offset_ns"].as_i64().unwrap(),
            drift_ppb: m["drift_ppb"].as_i64().unwrap(),
            measured_ns: m["measured_ns"].as_i64().unwrap(),
        },
        "rejoined" => ControlMsg::Rejoined {
            ranks: ranks(m),
            commnodes: u32_of(m, "commnodes"),
            parent: str_of(m, "parent").to_owned(),
        },
        other => panic!("unknown control type {other}"),
    }
}

#[test]
fn control_vectors() {
    let mut seen = std::collections::BTreeSet::new();
    for case in &load("control.json") {
        let name = str_of(case, "name");
        let msg = control_from_json(&case["msg"]);
        let wire = unhex(case, "hex");
        assert_eq!(hex::encode(msg.encode()), hex::encode(&wire), "{name}");
        assert_eq!(ControlMsg::decode(&wire).unwrap(), msg, "{name}");
        seen.insert(wire[0]);
    }
    // Every message tag, 1 (Plan) to 32 (MemberPlan), has a vector.
    assert_eq!(seen, (1..=32).collect(), "control tags with vectors");
}

/// The variant name of an error, e.g. `Truncated`.
fn kind(e: &DecodeError) -> String {
    format!("{e:?}").chars().take_while(char::is_ascii_alphanumeric).collect()
}

#[test]
fn invalid_vectors() {
    let cases = load("invalid.json");
    for decoder in ["values", "batch", "grant", "control"] {
        assert!(cases.iter().any(|c| c["decoder"] == decoder), "no invalid vector for {decoder}");
    }
    for case in &cases {
        let name = str_of(case, "name");
        let wire = unhex(case, "hex");
        let err = match str_of(case, "decoder") {
            "values" => decode_values(&wire).map(drop),
            "batch" => decode_batch(Bytes::from(wire.clone())).map(drop),
            // One whole credit frame, which the frame codec accepts; its grant does not decode.
            "grant" => {
                let frames = decode_batch(Bytes::from(wire.clone())).unwrap();
                assert_eq!(frames.len(), 1, "{name}");
                assert_eq!(frames[0].header.kind, FrameKind::Credit, "{name}");
                frames[0].grant().map(drop)
            }
            "control" => ControlMsg::decode(&wire).map(drop),
            other => panic!("unknown decoder {other}"),
        }
        .expect_err(name);
        assert_eq!(kind(&err), str_of(case, "error"), "{name}: {err}");
        // A plan from another version says which, so that a mixed installation is diagnosed.
        if name.starts_with("plan version ") {
            let version = u16::from_le_bytes([wire[1], wire[2]]);
            assert!(
                err.to_string().contains(&format!("version {version} is not supported")),
                "{name}: {err}"
            );
        }
        // The cutter every link runs sees the same errors as the batch decoder, or
        // waits for more bytes.
        if case["decoder"] == "batch" {
            let mut buf = BytesMut::from(&wire[..]);
            match cut_frames(&mut buf, MAX_PAYLOAD_LEN) {
                Ok(_) => {}
                Err(CutError::Malformed(e)) => assert_eq!(e, err, "{name}"),
                Err(other) => panic!("{name}: {other}"),
            }
        }
    }
}
