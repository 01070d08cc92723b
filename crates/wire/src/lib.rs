//! The wire layer of treecast: everything that crosses a link, as plain data.
//!
//! * [`FrameHeader`] and [`Frame`]: the unit every link carries, with a fixed
//!   28-byte little-endian header followed by the payload.
//! * [`cut_frames_into`] cuts the bytes a link read into frames (the one cutter
//!   every link runs); [`encode_batch`] and [`decode_batch`] pack many frames into
//!   one buffer (one syscall).
//! * [`Value`], [`ValueType`] and [`Format`]: typed payloads described by
//!   MRNet-style format strings (`%d %lf %as` ...), see [`encode_values`].
//! * [`ControlMsg`]: the messages nodes exchange to build the tree ([`LaunchPlan`],
//!   join and leave), create streams ([`StreamSpec`], with filters named by
//!   [`FilterSpec`] and flow-control [`Window`]s) and report failures.
//! * [`RouteMsg`]: what two nodes' drivers tell each other about the route
//!   between them (joining a parent's multicast group, placeholders for frames
//!   sent by multicast).
//! * [`RankSet`]: compact sets of back-end ranks (`0-15,32`).
//! * [`NetworkHello`]: what two networks' front-ends tell each other when they link.
//! * [`McastHeader`]: datagrams of the reliable UDP multicast route
//!   ([`encode_mcast`], [`decode_mcast`]).
//!
//! No function here does I/O; every decoder returns a typed [`DecodeError`]
//! and is fuzzed (see `fuzz/`). The byte layout is written down in
//! `docs/wire-format.md` and pinned by the vectors in `testdata/wire/`.

mod codec;
mod collective;
mod control;
mod cut;
mod error;
mod format;
mod frame;
mod hello;
mod links;
mod mcast;
mod peer;
mod plan;
mod rankset;
pub mod requests;
mod routemsg;
mod stripe;
mod value;

pub use codec::Reader;
pub use collective::{
    decode_collective, decode_entries, encode_collective, encode_entry, order_set, CollectiveCall,
    CollectiveHead, CollectiveOp, Combine, FLAG_PEER_COLL, MAX_COLLECTIVE_ERROR,
};
pub use control::{
    AttachPoint, ClockSample, CollectMode, ControlMsg, FilterSpec, RouteChoice, SpawnOrder, StreamSpec,
    SyncMode, Window, MAX_FALLBACKS, MAX_FILTER_NAME,
};
pub use cut::{cut_frames, cut_frames_into, CutError, NoFiles, PayloadFiles, MAX_FRAMES_GUESS, READ_CHUNK};
pub use error::{DecodeError, EncodeError, FormatError};
pub use format::Format;
pub use frame::{
    decode_batch, encode_batch, Frame, FrameHeader, FrameKind, Grant, DEFAULT_DOWN_WINDOW, DEFAULT_UP_WINDOW,
    FLAG_DIRECT, FLAG_EQCLASS, FLAG_PARTIAL_AVG, FLAG_PAYLOAD_FD, FLAG_PEER_ACK, FLAG_STAMPED, FLAG_TIMED,
    HEADER_LEN, MAX_PAYLOAD_LEN, PROTOCOL_VERSION, TIMESTAMP_AT,
};
pub use hello::{
    decode_network_hello, encode_network_hello, network_hello_len, NetworkHello, MAX_HELLO_SESSION,
    NETWORK_HELLO_HEAD, NETWORK_HELLO_MAGIC,
};
pub use links::{LinkId, LinkMap, LinkTable};
pub use mcast::{
    decode_mcast, encode_mcast, McastAnswer, McastDatagram, McastHeader, McastKind, MCAST_HEADER_LEN,
    MCAST_MAX_HOLES, MCAST_MORE, MCAST_TAG_LEN, MCAST_VERSION,
};
pub use peer::{decode_ack, decode_multi, encode_ack, encode_multi, FLAG_PEER_MULTI, PEER_ACK_LEN};
pub use plan::{
    ClockPlan, GroupPlace, LaunchPlan, LauncherSpec, LocalRoute, MemberPlan, DEFAULT_MAX_CONTROL,
    LOCAL_LAUNCHER, MAX_LAUNCHER_NAME, MAX_RAILS, MAX_STRIPES, MEMBER_PLAN_VERSION, PLAN_VERSION,
    SLURM_LAUNCHER, SSH_LAUNCHER,
};
pub use rankset::RankSet;
pub use routemsg::{McastOffer, RouteMsg, MAX_DECLINE_REASON};
pub use stripe::{PieceHeader, MAX_PIECE, PIECE_HEADER_LEN};
pub use value::{
    decode_format, decode_values, encode_bytes_head, encode_values, skip_value, ArrayElement, ScalarType,
    Value, ValueType,
};
