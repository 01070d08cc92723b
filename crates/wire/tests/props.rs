//! Property tests: every encoder round-trips through its decoder, and no decoder
//! panics, whatever bytes it is given.
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use treecast_wire::{
    cut_frames, decode_batch, decode_collective, decode_values, encode_batch, encode_collective,
    encode_values, AttachPoint, ClockPlan, CollectiveHead, CollectiveOp, Combine, ControlMsg, CutError,
    DecodeError, FilterSpec, Format, Frame, FrameHeader, FrameKind, Grant, GroupPlace, LaunchPlan,
    LauncherSpec, LocalRoute, McastOffer, MemberPlan, RankSet, Reader, RouteChoice, RouteMsg, ScalarType,
    SpawnOrder, StreamSpec, SyncMode, Value, ValueType, Window, FLAG_PAYLOAD_FD, MAX_FILTER_NAME,
    MAX_PAYLOAD_LEN, MEMBER_PLAN_VERSION, PLAN_VERSION,
};

fn short_string() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

/// Values whose floats come from `f32s` and `f64s`.
fn value_with(
    f32s: impl Strategy<Value = f32> + Clone + 'static,
    f64s: impl Strategy<Value = f64> + Clone + 'static,
) -> BoxedStrategy<Value> {
    const N: usize = 6;
    prop_oneof![
        any::<i8>().prop_map(Value::Char),
        any::<u8>().prop_map(Value::UChar),
        any::<i16>().prop_map(Value::Short),
        any::<u16>().prop_map(Value::UShort),
        any::<i32>().prop_map(Value::Int),
        any::<u32>().prop_map(Value::UInt),
        any::<i64>().prop_map(Value::Long),
        any::<u64>().prop_map(Value::ULong),
        f32s.clone().prop_map(Value::Float),
        f64s.clone().prop_map(Value::Double),
        short_string().prop_map(Value::Str),
        vec(any::<i8>(), 0..N).prop_map(Value::CharArray),
        vec(any::<u8>(), 0..N).prop_map(Value::UCharArray),
        vec(any::<i16>(), 0..N).prop_map(Value::ShortArray),
        vec(any::<u16>(), 0..N).prop_map(Value::UShortArray),
        vec(any::<i32>(), 0..N).prop_map(Value::IntArray),
        vec(any::<u32>(), 0..N).prop_map(Value::UIntArray),
        vec(any::<i64>(), 0..N).prop_map(Value::LongArray),
        vec(any::<u64>(), 0..N).prop_map(Value::ULongArray),
        vec(f32s, 0..N).prop_map(Value::FloatArray),
        vec(f64s, 0..N).prop_map(Value::DoubleArray),
        vec(short_string(), 0..N).prop_map(Value::StrArray),
        vec(any::<u8>(), 0..16).prop_map(Value::Bytes),
    ]
    .boxed()
}

/// Values without NaN, so that `==` is meaningful.
fn value() -> BoxedStrategy<Value> {
    use proptest::num::{f32 as F, f64 as D};
    let f32s = F::POSITIVE | F::NEGATIVE | F::NORMAL | F::SUBNORMAL | F::ZERO | F::INFINITE;
    let f64s = D::POSITIVE | D::NEGATIVE | D::NORMAL | D::SUBNORMAL | D::ZERO | D::INFINITE;
    value_with(f32s, f64s)
}

/// Values whose floats are arbitrary bit patterns, NaNs with payloads included.
fn value_any_bits() -> BoxedStrategy<Value> {
    value_with(any::<u32>().prop_map(f32::from_bits), any::<u64>().prop_map(f64::from_bits))
}

fn encode(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_values(values, &mut out);
    out
}

fn scalar_type() -> impl Strategy<Value = ScalarType> {
    proptest::sample::select(ScalarType::ALL.to_vec())
}

fn value_type() -> impl Strategy<Value = ValueType> {
    prop_oneof![
        scalar_type().prop_map(ValueType::Scalar),
        scalar_type().prop_map(ValueType::Array),
        Just(ValueType::Bytes),
    ]
}

fn header() -> impl Strategy<Value = FrameHeader> {
    (
        prop_oneof![Just(FrameKind::Data), Just(FrameKind::Control), Just(FrameKind::Credit)],
        any::<u16>(),
        any::<u32>(),
        any::<i32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(kind, flags, stream, tag, rank, timestamp_ns)| FrameHeader {
            kind,
            flags,
            stream,
            tag,
            rank,
            timestamp_ns,
        })
}

fn frame() -> impl Strategy<Value = Frame> {
    (header(), vec(any::<u8>(), 0..48)).prop_map(|(h, p)| Frame::new(h, p))
}

fn rank_set() -> impl Strategy<Value = RankSet> {
    prop_oneof![
        vec(any::<u32>(), 0..6).prop_map(|v| v.into_iter().collect::<RankSet>()),
        vec((0u32..1000, 0u32..50), 0..5).prop_map(|v| {
            let mut s = RankSet::new();
            for (lo, n) in v {
                s.insert_range(lo, lo + n);
            }
            s
        }),
        Just(RankSet::single(u32::MAX)),
    ]
}

fn sync_mode() -> impl Strategy<Value = SyncMode> {
    prop_oneof![
        Just(SyncMode::WaitForAll),
        any::<u32>().prop_map(SyncMode::TimeOut),
        Just(SyncMode::DoNotWait)
    ]
}

fn strings(n: usize) -> impl Strategy<Value = Vec<String>> {
    vec(short_string(), 0..n)
}

fn plan() -> impl Strategy<Value = LaunchPlan> {
    let launcher =
        (
            "[a-z][a-z0-9-]{0,63}",
            short_string(),
            // Arguments with spaces, quotes and `%` must survive as they are.
            vec(prop_oneof![short_string(), "[ -~]{0,30}"], 0..4),
            any::<u32>(),
            short_string(),
            short_string(),
        )
            .prop_map(|(name, program, args, connect_timeout_s, remote_path, remote_prefix)| {
                LauncherSpec { name, program, args, connect_timeout_s, remote_path, remote_prefix }
            });
    (
        (short_string(), any::<u32>(), any::<u32>(), any::<u32>(), short_string(), strings(4)),
        (vec((short_string(), short_string()), 0..4), any::<u32>(), any::<u32>(), any::<bool>()),
        (
            prop_oneof![Just(LocalRoute::Unix), Just(LocalRoute::Tcp)],
            short_string(),
            short_string(),
            launcher,
            1..=(treecast_wire::MAX_PAYLOAD_LEN as u32),
            short_string(),
        ),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            proptest::option::of(vec((short_string(), short_string()), 0..3)),
            any::<u32>(),
            vec(short_string(), 0..3),
        ),
        1..=(treecast_wire::MAX_PAYLOAD_LEN as u32),
        clock_plan(),
        (
            any::<u32>(),
            0..=treecast_wire::MAX_STRIPES,
            any::<bool>(),
            any::<u32>(),
            vec("[a-z0-9./]{1,12}", 0..=treecast_wire::MAX_RAILS),
        ),
    )
        .prop_map(
            |(
                (session, node_id, first_rank, total_backends, topology, backend),
                (env, startup_timeout_ms, attach_ms, allow_missing),
                (local_route, listen, remote_listen, launcher, max_frame, log),
                (heartbeat_ms, dead_after_ms, rejoin_ms, udp, depth, filters),
                max_control,
                clock,
                (zero_copy_min, stripes, mptcp, stripe_stall_ms, rails),
            )| LaunchPlan {
                session,
                node_id,
                first_rank,
                total_backends,
                topology,
                backend,
                env,
                startup_timeout_ms,
                attach_ms,
                allow_missing,
                local_route,
                listen,
                remote_listen,
                launcher,
                max_frame,
                log,
                heartbeat_ms,
                dead_after_ms,
                rejoin_ms,
                udp,
                depth,
                filters,
                max_control,
                clock,
                zero_copy_min,
                stripes,
                mptcp,
                stripe_stall_ms,
                rails,
            },
        )
}

fn clock_plan() -> impl Strategy<Value = ClockPlan> {
    (proptest::array::uniform4(proptest::option::of(any::<u32>())), short_string()).prop_map(
        |([resync_ms, probes, probe_burst, probe_gap_us], distort)| ClockPlan {
            resync_ms,
            probes,
            probe_burst,
            probe_gap_us,
            distort,
        },
    )
}

fn member_plan() -> impl Strategy<Value = MemberPlan> {
    let group = proptest::option::of(any::<[u32; 3]>().prop_map(|[group, rank, size]| GroupPlace {
        group,
        rank,
        size,
    }));
    (any::<[u32; 8]>(), group, clock_plan()).prop_map(
        |(
            [node_id, rank, size, heartbeat_ms, dead_after_ms, rejoin_ms, zero_copy_min, stripe_stall_ms],
            group,
            clock,
        )| {
            MemberPlan {
                node_id,
                rank,
                size,
                group,
                heartbeat_ms,
                dead_after_ms,
                rejoin_ms,
                clock,
                zero_copy_min,
                stripe_stall_ms,
            }
        },
    )
}

/// Names of 1 to [`MAX_FILTER_NAME`] bytes, the longest included.
fn filter_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9_.:/-]{0,15}",
        "\\PC{1,12}",
        Just("f".repeat(MAX_FILTER_NAME)),
        Just("\u{e9}".repeat(MAX_FILTER_NAME / 2)),
    ]
}

fn filter_spec() -> impl Strategy<Value = FilterSpec> {
    (filter_name(), any::<u16>(), prop_oneof![Just(Vec::new()), vec(any::<u8>(), 0..24)])
        .prop_map(|(name, version, params)| FilterSpec { name, version, params })
}

fn window() -> impl Strategy<Value = Window> {
    (1..=u32::MAX, prop_oneof![1..=u64::MAX, 1u64..4096])
        .prop_map(|(packets, bytes)| Window { packets, bytes })
}

fn stream_spec() -> impl Strategy<Value = StreamSpec> {
    let routes = prop_oneof![
        Just(RouteChoice::Network),
        Just(RouteChoice::Tcp),
        Just(RouteChoice::Udp),
        Just(RouteChoice::Striped)
    ];
    (
        any::<u32>(),
        rank_set(),
        sync_mode(),
        filter_spec(),
        filter_spec(),
        window(),
        window(),
        any::<u32>(),
        routes,
    )
        .prop_map(|(id, ranks, sync, up, down, up_window, down_window, program, route)| StreamSpec {
            id,
            ranks,
            sync,
            up,
            down,
            up_window,
            down_window,
            program,
            route,
        })
}

fn attach_point() -> impl Strategy<Value = AttachPoint> {
    (any::<u32>(), any::<u32>(), short_string()).prop_map(|(rank, node_id, address)| AttachPoint {
        rank,
        node_id,
        address,
    })
}

fn control_msg() -> impl Strategy<Value = ControlMsg> {
    prop_oneof![
        plan().prop_map(|p| ControlMsg::Plan(Box::new(p))),
        member_plan().prop_map(|p| ControlMsg::MemberPlan(Box::new(p))),
        (rank_set(), any::<u32>()).prop_map(|(ranks, commnodes)| ControlMsg::Join { ranks, commnodes }),
        short_string().prop_map(|message| ControlMsg::LaunchFailed { message }),
        stream_spec().prop_map(ControlMsg::NewStream),
        any::<u32>().prop_map(|id| ControlMsg::CloseStream { id }),
        (rank_set(), short_string(), any::<bool>()).prop_map(|(ranks, reason, graceful)| ControlMsg::Leave {
            ranks,
            reason,
            graceful
        }),
        (any::<u32>(), any::<u32>(), short_string())
            .prop_map(|(stream, rank, message)| ControlMsg::FilterError { stream, rank, message }),
        Just(ControlMsg::Shutdown),
        vec(attach_point(), 0..4).prop_map(|points| ControlMsg::AttachPoints { points }),
        (any::<u32>(), short_string(), short_string())
            .prop_map(|(stream, node, message)| ControlMsg::StreamRefused { stream, node, message }),
        (vec(any::<u32>(), 8), vec(short_string(), 0..4), any::<[bool; 2]>(), short_string()).prop_map(
            |(v, command, [attach, light], host)| {
                ControlMsg::Spawn(SpawnOrder {
                    target: v[0],
                    first_node_id: v[1],
                    first_rank: v[2],
                    count: v[3],
                    size: v[4],
                    group: v[5],
                    group_first: v[6],
                    group_size: v[7],
                    command,
                    attach,
                    host,
                    light,
                })
            }
        ),
        (rank_set(), short_string()).prop_map(|(ranks, reason)| ControlMsg::Stop { ranks, reason }),
        (any::<[u32; 3]>(), vec(short_string(), 0..3))
            .prop_map(|([id, rank, n], command)| ControlMsg::SpawnRequest { id, rank, n, command }),
        (any::<[u32; 3]>(), rank_set(), short_string()).prop_map(|([id, rank, group], ranks, error)| {
            ControlMsg::SpawnReply { id, rank, group, ranks, error }
        }),
    ]
}

/// The tag byte each message is written with.
fn tag_of(msg: &ControlMsg) -> u8 {
    match msg {
        ControlMsg::Plan(_) => 1,
        ControlMsg::Join { .. } => 2,
        ControlMsg::LaunchFailed { .. } => 3,
        ControlMsg::NewStream(_) => 4,
        ControlMsg::CloseStream { .. } => 5,
        ControlMsg::Leave { .. } => 6,
        ControlMsg::FilterError { .. } => 7,
        ControlMsg::Shutdown => 8,
        ControlMsg::AttachPoints { .. } => 9,
        ControlMsg::StreamRefused { .. } => 10,
        ControlMsg::Spawn(_) => 23,
        ControlMsg::Stop { .. } => 24,
        ControlMsg::SpawnRequest { .. } => 25,
        ControlMsg::SpawnReply { .. } => 26,
        ControlMsg::MemberPlan(_) => 32,
        other => unreachable!("no tag known for {other:?}"),
    }
}

fn is_invalid(r: Result<ControlMsg, DecodeError>) -> bool {
    matches!(r, Err(DecodeError::Invalid { .. }))
}

/// Applies `(position, byte)` overwrites and then truncates to `cut` (modulo the length).
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    if !bytes.is_empty() {
        let len = bytes.len();
        for &(pos, b) in edits {
            bytes[pos % len] = b;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % (len + 1));
        }
    }
    bytes
}

fn socket_addr() -> impl Strategy<Value = std::net::SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| (std::net::Ipv4Addr::from(ip), port).into()),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| (std::net::Ipv6Addr::from(ip), port).into()),
    ]
}

fn route_msg() -> impl Strategy<Value = RouteMsg> {
    let offer = (socket_addr(), socket_addr(), any::<[u32; 2]>(), 1..=u32::MAX, any::<[u32; 5]>()).prop_map(
        |(
            group,
            sender,
            [node, max_cwnd],
            fragment,
            [receiver_timeout_us, nack_repeat_us, silent_limit_ms, max_message, nack_backoff_us],
        )| {
            RouteMsg::Offer(McastOffer {
                group,
                sender,
                node,
                max_cwnd,
                fragment,
                receiver_timeout_us,
                nack_repeat_us,
                silent_limit_ms,
                max_message,
                nack_backoff_us,
            })
        },
    );
    prop_oneof![
        offer,
        socket_addr().prop_map(|answers_from| RouteMsg::Joined { answers_from }),
        "\\PC{0,40}".prop_map(|reason| RouteMsg::Declined { reason }),
        any::<u32>().prop_map(|message| RouteMsg::Carried { message }),
        any::<u32>().prop_map(|first| RouteMsg::Member { first }),
    ]
}

fn collective_head() -> impl Strategy<Value = CollectiveHead> {
    let op = prop_oneof![
        Just(CollectiveOp::Reduce),
        Just(CollectiveOp::AllReduce),
        Just(CollectiveOp::AllGather),
        Just(CollectiveOp::ReduceScatter),
        Just(CollectiveOp::Barrier),
    ];
    let combine = prop_oneof![
        Just(Combine::None),
        Just(Combine::Sum),
        Just(Combine::Min),
        Just(Combine::Max),
        Just(Combine::Avg)
    ];
    (
        op,
        combine,
        any::<bool>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        rank_set(),
        rank_set(),
        short_string(),
    )
        .prop_map(|(op, combine, down, context, seq, root, members, some, error)| {
            // Up, the contributors are among the members.
            let contributors = if down { some } else { some.intersection(&members) };
            let order = if op == CollectiveOp::ReduceScatter { members.iter().collect() } else { Vec::new() };
            CollectiveHead { op, combine, down, context, seq, root, members, contributors, error, order }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn collective_heads_round_trip_and_refuse_every_cut(head in collective_head(), body in vec(any::<u8>(), 0..8)) {
        let wire = encode_collective(&head, &body);
        let (back, at) = decode_collective(&wire).unwrap();
        prop_assert_eq!(back, head);
        prop_assert_eq!(&wire[at..], &body[..]);
        for cut in 0..at {
            prop_assert!(decode_collective(&wire[..cut]).is_err());
        }
    }

    #[test]
    fn route_messages_round_trip_and_refuse_every_cut(msg in route_msg()) {
        let wire = msg.encode();
        prop_assert_eq!(RouteMsg::decode(&wire).unwrap(), msg);
        for cut in 0..wire.len() {
            prop_assert!(RouteMsg::decode(&wire[..cut]).is_err());
        }
    }

    #[test]
    fn values_round_trip(values in vec(value(), 0..8)) {
        let wire = encode(&values);
        prop_assert_eq!(decode_values(&wire).unwrap(), values);
    }

    #[test]
    fn values_keep_float_bit_patterns(values in vec(value_any_bits(), 0..8)) {
        // The encoding is injective, so equal re-encodings mean equal bits, NaNs included.
        let wire = encode(&values);
        let back = decode_values(&wire).unwrap();
        prop_assert_eq!(back.len(), values.len());
        prop_assert_eq!(encode(&back), wire);
    }

    #[test]
    fn format_of_values_round_trips(values in vec(value(), 0..8)) {
        let format = Format::of(&values);
        prop_assert_eq!(format.len(), values.len());
        format.check(&values).unwrap();
        let text = format.to_string();
        prop_assert_eq!(Format::parse(&text).unwrap(), format);
    }

    #[test]
    fn format_parses_any_spacing_and_synonym(
        items in vec((value_type(), proptest::sample::select(vec!["", " ", "  ", "\t", "\n ", "\u{3000}"]), any::<bool>()), 0..8),
        lead in proptest::sample::select(vec!["", " ", "\t"]),
    ) {
        let mut text = String::from(lead);
        for (ty, sep, upper) in &items {
            let spec = ty.spec();
            if *upper && matches!(ty, ValueType::Array(_)) {
                text.push_str(&spec.replacen("%a", "%A", 1));
            } else {
                text.push_str(spec);
            }
            text.push_str(sep);
        }
        let types: Vec<ValueType> = items.iter().map(|i| i.0).collect();
        let parsed = Format::parse(&text).unwrap();
        prop_assert_eq!(&parsed.types, &types);
        prop_assert_eq!(parsed.to_string(), types.iter().map(|t| t.spec()).collect::<Vec<_>>().join(" "));
    }

    #[test]
    fn frames_round_trip_in_batches(frames in vec(frame(), 0..6)) {
        let wire = encode_batch(&frames);
        prop_assert_eq!(wire.len(), frames.iter().map(Frame::wire_len).sum::<usize>());
        prop_assert_eq!(decode_batch(wire).unwrap(), frames);
    }

    #[test]
    fn the_frame_cutter_handles_any_split(frames in vec(frame(), 0..6), splits in vec(0usize..80, 0..20)) {
        // A byte stream carries no payload files (see the next property).
        let frames: Vec<Frame> = frames
            .into_iter()
            .map(|mut f| {
                f.header.flags &= !FLAG_PAYLOAD_FD;
                f
            })
            .collect();
        let wire = encode_batch(&frames);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut rest = &wire[..];
        let mut sizes = splits.into_iter();
        while !rest.is_empty() {
            let n = sizes.next().unwrap_or(rest.len()).min(rest.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            out.extend(cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap());
        }
        prop_assert!(cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap().is_empty());
        prop_assert!(buf.is_empty());
        prop_assert_eq!(out, frames);
    }

    #[test]
    fn the_frame_cutter_refuses_a_frame_claiming_a_payload_file(before in vec(frame(), 0..4), claim in frame()) {
        let mut claim = claim;
        claim.header.flags |= FLAG_PAYLOAD_FD;
        let before: Vec<Frame> = before
            .into_iter()
            .map(|mut f| {
                f.header.flags &= !FLAG_PAYLOAD_FD;
                f
            })
            .collect();
        let mut buf = BytesMut::from(&encode_batch(&[before, vec![claim]].concat())[..]);
        prop_assert_eq!(cut_frames(&mut buf, MAX_PAYLOAD_LEN), Err(CutError::NoFile));
    }

    #[test]
    fn control_round_trips(msg in control_msg()) {
        let wire = msg.encode();
        prop_assert_eq!(wire[0], tag_of(&msg));
        prop_assert_eq!(ControlMsg::decode(&wire).unwrap(), msg);
    }

    #[test]
    fn control_prefixes_and_extensions_are_refused(msg in control_msg(), extra in any::<u8>()) {
        // Every message is self-delimiting: no strict prefix decodes, and neither does one more byte.
        let wire = msg.encode();
        for cut in 0..wire.len() {
            prop_assert!(ControlMsg::decode(&wire[..cut]).is_err(), "{:?} cut at {}", msg, cut);
        }
        let mut longer = wire;
        longer.push(extra);
        let refused = matches!(ControlMsg::decode(&longer), Err(DecodeError::TrailingBytes { count: 1, .. }));
        prop_assert!(refused);
    }

    #[test]
    fn plans_of_other_versions_are_refused(plan in plan(), version in any::<u16>()) {
        prop_assume!(version != PLAN_VERSION);
        let mut wire = ControlMsg::Plan(Box::new(plan)).encode();
        prop_assert_eq!(u16::from_le_bytes([wire[1], wire[2]]), PLAN_VERSION);
        wire[1..3].copy_from_slice(&version.to_le_bytes());
        let err = ControlMsg::decode(&wire).unwrap_err();
        prop_assert!(matches!(err, DecodeError::Invalid { .. }), "{}", err);
        let expected = format!("version {version} is not supported");
        prop_assert!(err.to_string().contains(&expected), "{}", err);
    }

    #[test]
    fn member_plans_of_other_versions_are_refused(plan in member_plan(), version in any::<u16>()) {
        prop_assume!(version != MEMBER_PLAN_VERSION);
        let mut wire = ControlMsg::MemberPlan(Box::new(plan)).encode();
        prop_assert_eq!(u16::from_le_bytes([wire[1], wire[2]]), MEMBER_PLAN_VERSION);
        wire[1..3].copy_from_slice(&version.to_le_bytes());
        let err = ControlMsg::decode(&wire).unwrap_err();
        prop_assert!(matches!(err, DecodeError::Invalid { .. }), "{}", err);
        let expected = format!("invalid member plan: version {version} is not supported");
        prop_assert!(err.to_string().contains(&expected), "{}", err);
    }

    #[test]
    fn empty_windows_are_refused(spec in stream_spec(), which in 0..4usize) {
        let mut spec = spec;
        match which {
            0 => spec.up_window.packets = 0,
            1 => spec.up_window.bytes = 0,
            2 => spec.down_window.packets = 0,
            _ => spec.down_window.bytes = 0,
        }
        prop_assert!(is_invalid(ControlMsg::decode(&ControlMsg::NewStream(spec).encode())));
    }

    #[test]
    fn filter_names_out_of_bounds_are_refused(spec in stream_spec(), down in any::<bool>(), long in any::<bool>()) {
        let mut spec = spec;
        let name = if long { "n".repeat(MAX_FILTER_NAME + 1) } else { String::new() };
        if down { spec.down.name = name } else { spec.up.name = name }
        prop_assert!(is_invalid(ControlMsg::decode(&ControlMsg::NewStream(spec).encode())));
    }

    #[test]
    fn flags_other_than_0_and_1_are_refused(ranks in rank_set(), reason in short_string(), flag in 2u8..) {
        let mut wire = ControlMsg::Leave { ranks, reason, graceful: true }.encode();
        *wire.last_mut().unwrap() = flag;
        prop_assert!(is_invalid(ControlMsg::decode(&wire)));
    }

    #[test]
    fn credit_frames_carry_their_grant(stream in any::<u32>(), packets in any::<u32>(), bytes in any::<u64>()) {
        let grant = Grant { packets, bytes };
        let frame = Frame::credit(stream, grant);
        prop_assert_eq!(frame.header, FrameHeader::credit(stream));
        prop_assert_eq!(frame.payload.len(), 12);
        let back = decode_batch(encode_batch(&[frame])).unwrap();
        prop_assert_eq!(back.len(), 1);
        prop_assert_eq!(back[0].header.kind, FrameKind::Credit);
        prop_assert_eq!(back[0].header.stream, stream);
        prop_assert_eq!(back[0].grant().unwrap(), grant);
    }

    #[test]
    fn grants_of_the_wrong_size_are_refused(payload in vec(any::<u8>(), 0..32)) {
        prop_assume!(payload.len() != 12);
        prop_assert!(Frame::new(FrameHeader::credit(1), payload).grant().is_err());
    }

    #[test]
    fn rank_set_round_trips(set in rank_set()) {
        let mut wire = Vec::new();
        set.encode(&mut wire);
        let mut r = Reader::new(&wire);
        prop_assert_eq!(RankSet::decode(&mut r).unwrap(), set);
        prop_assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in vec(any::<u8>(), 0..200)) {
        let _ = decode_values(&bytes);
        let _ = decode_batch(Bytes::from(bytes.clone()));
        let _ = ControlMsg::decode(&bytes);
        let _ = FrameHeader::decode(&bytes);
        let _ = RankSet::decode(&mut Reader::new(&bytes));
        let _ = Frame::new(FrameHeader::credit(0), bytes.clone()).grant();
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = cut_frames(&mut buf, MAX_PAYLOAD_LEN);
    }

    #[test]
    fn decoders_never_panic_on_mutated_encodings(
        values in vec(value(), 0..6),
        msg in control_msg(),
        frames in vec(frame(), 0..4),
        edits in vec((any::<usize>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        if let Ok(back) = decode_values(&mutate(encode(&values), &edits, cut)) {
            // Whatever decodes must re-encode to a payload that decodes the same.
            prop_assert_eq!(decode_values(&encode(&back)).unwrap().len(), back.len());
        }
        if let Ok(m) = ControlMsg::decode(&mutate(msg.encode(), &edits, cut)) {
            prop_assert_eq!(ControlMsg::decode(&m.encode()).unwrap(), m);
        }
        let _ = decode_batch(Bytes::from(mutate(encode_batch(&frames).to_vec(), &edits, cut)));
    }

    /// A payload's format read without its values is what decoding them gives, and
    /// a payload that does not decode fails the same way, for encodings, damaged
    /// encodings and any bytes.
    #[test]
    fn a_payload_s_format_read_alone_is_its_values_format(
        values in vec(value(), 0..6),
        edits in vec((any::<usize>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<usize>()),
        bytes in vec(any::<u8>(), 0..64),
    ) {
        for payload in [encode(&values), mutate(encode(&values), &edits, cut), bytes.clone()] {
            prop_assert_eq!(
                treecast_wire::decode_format(&payload),
                decode_values(&payload).map(|v| treecast_wire::Format::of(&v))
            );
        }
    }

    #[test]
    fn format_parse_never_panics(text in "\\PC{0,40}", grammar in "[%aAbcudhlfs \t]{0,30}") {
        let _ = Format::parse(&text);
        match Format::parse(&grammar) {
            // Whatever parses prints to a canonical form that parses the same.
            Ok(f) => prop_assert_eq!(Format::parse(&f.to_string()).unwrap(), f),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
