//! The multicast route as a node drives it: a [`GroupSender`] at a node that
//! multicasts large downstream frames to the children that joined its group, and a
//! [`GroupMember`] at each such child.
//!
//! A frame keeps its place among the other frames of the link: the link carries a
//! [`RouteMsg::Carried`] placeholder where the frame would have been, and the child
//! hands the frame on only once the placeholder has come and the message is whole;
//! what the link brings after the placeholder waits behind it. So control frames,
//! credits and small data frames keep going over the link, and the core sees every
//! frame in the order its parent sent it.
//!
//! A message is the frame's bytes after a list of the children it is for: every
//! member receives and acknowledges every message (the protocol completes a message
//! only when all have), and drops those not for it.
//!
//! Both sides are polled from the node's driver task: sockets are non-blocking,
//! timers are the protocol machines' deadlines.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::Context;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use socket2::{Domain, Protocol, SockAddr, Socket as RawSocket, Type};
use tokio::net::UdpSocket;
use treecast_monitor::RouteReport;
use treecast_wire::{
    decode_batch, Frame, FrameHeader, FrameKind, McastAnswer, McastOffer, RouteMsg, FLAG_DIRECT,
};

use super::batch::{enable_gro, Gso, RecvBatch, SendBatch};
use super::udp::Sealer;
use super::{McastConfig, McastKey, Receiver, ReceiverEvent, Sender, SenderEvent};
use crate::{LinkId, TransportError};

/// Socket buffers asked for (the kernel caps them at `net.core.[rw]mem_max`): a
/// window of fragments in flight must fit, or the kernel drops what the protocol
/// then resends.
const SOCKET_BUFFER: usize = 4 << 20;
/// Datagrams read per poll before the driver's other work gets its turn.
const READ_BUDGET: usize = 256;

/// A route frame carrying `msg`.
pub fn route_frame(msg: &RouteMsg) -> Frame {
    let header =
        FrameHeader { kind: FrameKind::Route, flags: 0, stream: 0, tag: 0, rank: 0, timestamp_ns: 0 };
    Frame::new(header, msg.encode())
}

/// A protocol machine's deadline as a tokio timer.
#[derive(Default)]
struct Timer {
    at: Option<Instant>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Timer {
    /// Arms the timer for `at` (none: disarmed); true when it has already fired.
    fn poll(&mut self, cx: &mut Context<'_>, at: Option<Instant>) -> bool {
        if at != self.at {
            self.at = at;
            self.sleep = at.map(|at| Box::pin(tokio::time::sleep_until(at.into())));
        }
        let fired = self.sleep.as_mut().is_some_and(|s| s.as_mut().poll(cx).is_ready());
        if fired {
            self.at = None;
            self.sleep = None;
        }
        fired
    }
}

fn io_error(what: String) -> impl FnOnce(std::io::Error) -> TransportError {
    move |source| TransportError::Io { what, source }
}

/// A non-blocking UDP socket bound to `addr`, its buffers enlarged.
fn udp_socket(addr: SocketAddr, reuse: bool) -> Result<RawSocket, TransportError> {
    let sock = RawSocket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(io_error(format!("opening a UDP socket for {addr}")))?;
    if reuse {
        // Every member on one host binds the same group and port; each gets a copy.
        sock.set_reuse_address(true).map_err(io_error(format!("sharing UDP {addr}")))?;
    }
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
    sock.set_nonblocking(true).map_err(io_error(format!("making UDP {addr} non-blocking")))?;
    sock.bind(&SockAddr::from(addr)).map_err(io_error(format!("binding UDP {addr}")))?;
    Ok(sock)
}

fn into_tokio(sock: RawSocket, addr: SocketAddr) -> Result<UdpSocket, TransportError> {
    UdpSocket::from_std(sock.into()).map_err(io_error(format!("registering UDP {addr} with the runtime")))
}

/// The group address of node `node`: a multicast group of its own within the /16
/// of `base` (so that switches snooping IGMP send each host only its parent's
/// group), or `base` itself when it is a broadcast address. On the loopback
/// interface, where a broadcast cannot be sent, always a multicast group.
fn group_address(base: IpAddr, node: u32, interface: Ipv4Addr) -> Ipv4Addr {
    let base = match base {
        IpAddr::V4(b) if b.is_multicast() || !interface.is_loopback() => b,
        _ => match super::DEFAULT_GROUP {
            IpAddr::V4(d) => d,
            IpAddr::V6(_) => Ipv4Addr::new(239, 255, 84, 67),
        },
    };
    if !base.is_multicast() {
        return base;
    }
    let b = u32::from(base);
    Ipv4Addr::from((b & 0xffff_0000) | (b.wrapping_add(node) & 0xffff))
}

/// The port of node `node`'s group: `base` plus the node's id, wrapping within the
/// ports from `base` up; 0 (any free port) when `base` is 0.
fn node_port(base: u16, node: u32) -> u16 {
    if base == 0 {
        return 0;
    }
    let span = 65_536 - u32::from(base);
    (u32::from(base) + node % span) as u16
}

/// A child offered a place, as the sender knows it.
#[derive(Debug, Clone, Copy)]
struct Joiner {
    node: u32,
    /// Its answer socket, once it joined (it is then a member of the protocol's
    /// group): answers from elsewhere are dropped.
    answers_from: Option<SocketAddr>,
}

/// A node's side of its multicast group: see the module documentation.
pub struct GroupSender {
    socket: UdpSocket,
    sealer: Sealer,
    sender: Sender,
    config: McastConfig,
    node: u32,
    group: SocketAddr,
    local: SocketAddr,
    members: BTreeMap<LinkId, Joiner>,
    timer: Timer,
    inbuf: RecvBatch,
    /// Datagrams sealed and waiting to go out in one segmented send.
    batch: SendBatch,
    gso: Gso,
    report: RouteReport,
}

impl std::fmt::Debug for GroupSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupSender")
            .field("group", &self.group)
            .field("members", &self.members.len())
            .finish()
    }
}

impl GroupSender {
    /// Opens node `node`'s group on the interface with address `interface`: its
    /// datagrams go to `config.group`, on the port this socket is bound to.
    ///
    /// # Errors
    /// The socket cannot be opened or bound, or multicast cannot be sent on the interface.
    pub fn bind(
        interface: IpAddr,
        node: u32,
        key: McastKey,
        config: McastConfig,
    ) -> Result<GroupSender, TransportError> {
        let IpAddr::V4(ip) = interface else {
            return Err(TransportError::Config(format!(
                "the multicast route needs IPv4; the link's address is {interface}"
            )));
        };
        let mut config = config;
        if !config.fragment_set {
            if let Some(mtu) = interface_mtu(ip) {
                config.fragment = fragment_for_mtu(mtu);
            }
        }
        let sock = udp_socket(SocketAddr::new(interface, node_port(config.port, node)), false)?;
        // A window of large fragments (loopback's MTU is 64 KiB) must still fit half a
        // member's socket buffer, or the kernel drops what the window lets through.
        // Members on hosts like this one get what this socket got (the kernel caps
        // the 4 MiB asked for at net.core.rmem_max, and reports twice the usable size).
        let buffer = sock.recv_buffer_size().map_or(SOCKET_BUFFER, |b| b / 2).min(SOCKET_BUFFER);
        let fits = (buffer / 2 / config.fragment.max(1) as usize).max(4) as f64;
        config.max_cwnd = config.max_cwnd.min(fits);
        let group_ip = group_address(config.group, node, ip);
        let local = SocketAddr::new(interface, 0);
        if group_ip.is_multicast() {
            sock.set_multicast_if_v4(&ip).map_err(io_error(format!("sending multicast from {ip}")))?;
            sock.set_multicast_loop_v4(true).map_err(io_error("looping multicast back".into()))?;
            sock.set_multicast_ttl_v4(1).map_err(io_error("keeping multicast on the LAN".into()))?;
        } else {
            sock.set_broadcast(true).map_err(io_error(format!("allowing broadcast from {ip}")))?;
        }
        let socket = into_tokio(sock, local)?;
        let local = socket.local_addr().map_err(io_error("reading a UDP address".into()))?;
        let group = SocketAddr::new(IpAddr::V4(group_ip), local.port());
        Ok(GroupSender {
            socket,
            sealer: Sealer::new(key, &config),
            sender: Sender::new(config, node, []),
            config,
            node,
            group,
            local,
            members: BTreeMap::new(),
            timer: Timer::default(),
            inbuf: RecvBatch::new(4),
            batch: SendBatch::default(),
            gso: Gso::new(config.gso),
            report: RouteReport { node, group: group.to_string(), ..RouteReport::default() },
        })
    }

    /// The interface address the group was opened on.
    pub fn interface(&self) -> IpAddr {
        self.local.ip()
    }

    /// Offers child `node` on `link` a place; the offer to send over the link. It
    /// becomes a member once it has joined ([`GroupSender::joined`]).
    pub fn offer(&mut self, node: u32, link: LinkId) -> RouteMsg {
        self.members.insert(link, Joiner { node, answers_from: None });
        let us = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        RouteMsg::Offer(McastOffer {
            group: self.group,
            sender: self.local,
            node: self.node,
            max_cwnd: self.config.max_cwnd as u32,
            fragment: self.config.fragment,
            receiver_timeout_us: us(self.config.receiver_timeout),
            nack_repeat_us: us(self.config.nack_repeat),
            silent_limit_ms: u32::try_from(self.config.silent_limit.as_millis()).unwrap_or(u32::MAX),
            max_message: self.config.max_message,
            nack_backoff_us: us(self.config.nack_backoff),
        })
    }

    /// The child on `link` joined, its answers coming from `answers_from`: it is a
    /// member from the next message on. Returns the message telling it so, to send
    /// over its link before any placeholder; `None` for a link offered nothing (or
    /// joined already).
    pub fn joined(&mut self, link: LinkId, answers_from: SocketAddr) -> Option<RouteMsg> {
        let j = self.members.get_mut(&link).filter(|j| j.answers_from.is_none())?;
        j.answers_from = Some(answers_from);
        let first = self.sender.add_receiver(j.node);
        Some(RouteMsg::Member { first })
    }

    /// The smallest frame payload this group multicasts, when it has enough joined
    /// members to multicast at all (`min_members`); `None` otherwise.
    pub fn multicasts_from(&self) -> Option<usize> {
        let joined = self.members.values().filter(|j| j.answers_from.is_some()).count();
        (joined > 0 && joined >= self.config.min_members as usize).then_some(self.config.min_frame as usize)
    }

    /// Nothing queued or under way: every member holds every message.
    pub fn is_idle(&self) -> bool {
        self.sender.is_idle()
    }

    /// The child on `link` declined, or its link closed: nothing waits for it.
    pub fn leave(&mut self, link: LinkId, now: Instant) {
        if let Some(j) = self.members.remove(&link) {
            // Unless the same node is a member again through a newer link.
            let again = self.members.values().any(|o| o.node == j.node && o.answers_from.is_some());
            if j.answers_from.is_some() && !again {
                self.sender.remove_receiver(j.node, now);
            }
        }
    }

    /// True when the child on `link` is in the group (joined).
    pub fn has_member(&self, link: LinkId) -> bool {
        self.members.get(&link).is_some_and(|j| j.answers_from.is_some())
    }

    /// Multicasts `frame` when it is worth it: a downstream data frame for every
    /// addressed child (not one rank), of at least `min_frame` bytes, for at least
    /// `min_members` (2) joined members among `links`. Returns the links that get the placeholder
    /// instead (the frame itself goes over the others' links); `None`: send as usual.
    pub fn carry(&mut self, frame: &Frame, links: &[LinkId], now: Instant) -> Option<(Vec<LinkId>, Frame)> {
        let h = &frame.header;
        if h.kind != FrameKind::Data
            || h.flags & FLAG_DIRECT != 0
            || frame.payload.len() < self.config.min_frame as usize
        {
            return None;
        }
        let carried: Vec<LinkId> = links.iter().copied().filter(|l| self.has_member(*l)).collect();
        if carried.is_empty() || carried.len() < self.config.min_members as usize {
            return None;
        }
        let mut data = Vec::with_capacity(4 + 4 * carried.len() + frame.wire_len());
        data.extend_from_slice(&(carried.len() as u32).to_le_bytes());
        for l in &carried {
            let node = self.members.get(l).map_or(u32::MAX, |j| j.node);
            data.extend_from_slice(&node.to_le_bytes());
        }
        frame.encode(&mut data);
        match self.sender.send(h.stream, Bytes::from(data), now) {
            Ok(message) => {
                self.report.frames += 1;
                self.report.bytes += frame.payload.len() as u64;
                Some((carried, route_frame(&RouteMsg::Carried { message })))
            }
            Err(e) => {
                tracing::debug!("frame of {} bytes goes over the links: {e}", frame.payload.len());
                None
            }
        }
    }

    /// Reads answers, fires the protocol's timer and sends its datagrams; each member
    /// the protocol gave up on goes to `lost` with the reason. True when anything happened.
    pub fn poll(&mut self, cx: &mut Context<'_>, lost: &mut dyn FnMut(LinkId, String)) -> bool {
        let (sealer, sender, members, report) =
            (&mut self.sealer, &mut self.sender, &self.members, &mut self.report);
        let mut any = self.inbuf.read_each(&self.socket, cx, READ_BUDGET, |bytes, from| {
            let Some((header, payload)) = sealer.open(bytes, from) else { return };
            if members.values().any(|j| j.node == header.rank && j.answers_from == Some(from)) {
                // The decoder checked the payload: an answer that fails is not one.
                let Ok(answer) = McastAnswer::decode(&header, payload) else { return };
                sender.handle_answer(&header, &answer, Instant::now());
            } else {
                report.rejected += 1;
            }
        });
        if self.timer.poll(cx, self.sender.deadline()) {
            self.sender.handle_timeout(Instant::now());
            any = true;
        }
        any |= self.send_datagrams();
        while let Some(event) = self.sender.poll_event() {
            any = true;
            if let SenderEvent::Lost { receiver, reason } = event {
                let member =
                    self.members.iter().find(|(_, j)| j.node == receiver && j.answers_from.is_some());
                if let Some((&link, _)) = member {
                    self.members.remove(&link);
                    lost(link, reason);
                }
            }
        }
        if any {
            // The machine may have a new deadline: arm it (and wake if already due).
            if self.timer.poll(cx, self.sender.deadline()) {
                cx.waker().wake_by_ref();
            }
        }
        any
    }

    fn send_datagrams(&mut self) -> bool {
        let mut any = false;
        while let Some((header, payload)) = self.sender.poll_datagram() {
            any = true;
            self.sealer.seal(&header, &payload);
            if self.sealer.knob_drops() {
                self.report.not_sent += 1;
                continue;
            }
            if !self.batch.fits(self.sealer.sealed().len()) {
                self.flush();
            }
            self.batch.push(self.sealer.sealed());
        }
        self.flush();
        any
    }

    /// Sends the datagrams batched so far; one the kernel refuses is lost like one
    /// lost on the wire: the protocol resends it.
    fn flush(&mut self) {
        let (sent, failed) = self.gso.send(&self.socket, &mut self.batch, self.group);
        self.sealer.stats.sent += sent;
        self.report.not_sent += failed;
    }

    /// What the route did so far (the children outside the group are the driver's to add).
    pub fn report(&self) -> RouteReport {
        let s = self.sender.stats();
        RouteReport {
            udp_children: {
                let mut v: Vec<u32> =
                    self.members.values().filter(|j| j.answers_from.is_some()).map(|j| j.node).collect();
                v.sort_unstable();
                v
            },
            messages: s.messages,
            fragments: s.fragments,
            retransmitted: s.retransmitted,
            nacks: s.nacks,
            timeouts: s.timeouts,
            acker_changes: s.acker_changes,
            rejected: self.report.rejected + self.sealer.stats.rejected,
            ..self.report.clone()
        }
    }
}

/// A child's side of its parent's group: see the module documentation.
pub struct GroupMember {
    data: UdpSocket,
    answers: UdpSocket,
    sealer: Sealer,
    config: McastConfig,
    /// The parent's node id, naming its group in datagrams.
    group: u32,
    /// The protocol's receiver, from the parent's `Member` on; until then nothing is
    /// read (datagrams wait in the socket's buffer).
    receiver: Option<Receiver>,
    sender: SocketAddr,
    me: u32,
    /// Whole frames for this node, by message id, waiting for their placeholder.
    ready: BTreeMap<u32, Frame>,
    /// What the parent's link brought from the first placeholder whose message is
    /// not whole yet: it waits behind it.
    parked: VecDeque<Parked>,
    /// Since when the first parked placeholder has waited with no sign of life from
    /// the sender.
    waiting_since: Option<Instant>,
    /// The last message completed, to notice a placeholder whose message was not for us.
    last_message: Option<u32>,
    timer: Timer,
    inbuf: RecvBatch,
}

impl std::fmt::Debug for GroupMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupMember")
            .field("sender", &self.sender)
            .field("parked", &self.parked.len())
            .finish()
    }
}

/// Wrapping order of message ids: `a` is `b` or later.
fn at_or_after(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < u32::MAX / 2
}

/// One thing of the parent's link, waiting behind a placeholder.
#[derive(Debug)]
enum Parked {
    /// A frame the link carried itself.
    Frame(Frame),
    /// A placeholder: the multicast message with this id takes its place.
    Carried(u32),
}

impl GroupMember {
    /// Binds the group `offer` describes and joins it as node `me`, on the interface
    /// with address `interface` (the address of the link to the parent, or for a
    /// parent on this host the address it sends from). `local` supplies what the
    /// offer does not carry (the drop knob). Nothing is read until the parent's
    /// [`RouteMsg::Member`] comes through [`GroupMember::arrived`]. Returns the member
    /// and the address its answers come from, for [`RouteMsg::Joined`].
    ///
    /// # Errors
    /// IPv6, an interface address of 0.0.0.0, a group that cannot be bound or joined.
    pub fn join(
        offer: &McastOffer,
        interface: IpAddr,
        me: u32,
        key: McastKey,
        local: &McastConfig,
    ) -> Result<(GroupMember, SocketAddr), TransportError> {
        let (IpAddr::V4(ip), IpAddr::V4(group_ip)) = (interface, offer.group.ip()) else {
            return Err(TransportError::Config(format!(
                "the multicast route needs IPv4 (group {}, interface {interface})",
                offer.group
            )));
        };
        if ip.is_unspecified() {
            return Err(TransportError::Config("the link to the parent has no known address".into()));
        }
        let data = udp_socket(offer.group, true)?;
        if group_ip.is_multicast() {
            data.join_multicast_v4(&group_ip, &ip)
                .map_err(io_error(format!("joining multicast group {group_ip} on {ip}")))?;
        }
        let data = into_tokio(data, offer.group)?;
        // Coalesced reads where the kernel offers them; without, one datagram per buffer.
        let _ = enable_gro(&data);
        let answer_addr = SocketAddr::new(interface, 0);
        let answers = into_tokio(udp_socket(answer_addr, false)?, answer_addr)?;
        let answers_from = answers.local_addr().map_err(io_error("reading a UDP address".into()))?;
        // The parent's settings, made safe: a zero time-out would spin.
        let config = McastConfig {
            fragment: offer.fragment,
            max_cwnd: f64::from(offer.max_cwnd.max(1)),
            receiver_timeout: Duration::from_micros(offer.receiver_timeout_us.max(1_000).into()),
            nack_repeat: Duration::from_micros(offer.nack_repeat_us.into()),
            silent_limit: Duration::from_millis(offer.silent_limit_ms.max(10).into()),
            max_message: offer.max_message,
            nack_backoff: Duration::from_micros(offer.nack_backoff_us.into()),
            ..*local
        }
        .sanitized();
        let member = GroupMember {
            data,
            answers,
            sealer: Sealer::new(key, &config),
            config,
            group: offer.node,
            receiver: None,
            sender: offer.sender,
            me,
            ready: BTreeMap::new(),
            parked: VecDeque::new(),
            waiting_since: None,
            last_message: None,
            timer: Timer::default(),
            inbuf: RecvBatch::new(16),
        };
        Ok((member, answers_from))
    }

    /// The parent made this node a member from message `first` on: start reading.
    fn start(&mut self, first: u32) {
        if self.receiver.is_none() {
            self.receiver = Some(Receiver::new(self.config, self.me, self.group, first));
        }
    }

    /// A frame from the parent's link, in order: what can go on goes to `deliver`.
    ///
    /// # Errors
    /// A malformed or unexpected route frame, or a placeholder for a message that was
    /// not for this node: the link is broken.
    pub fn arrived(&mut self, frame: Frame, deliver: &mut dyn FnMut(Frame)) -> Result<(), String> {
        let parked = if frame.header.kind == FrameKind::Route {
            match RouteMsg::decode(&frame.payload) {
                Ok(RouteMsg::Carried { message }) if self.receiver.is_some() => {
                    if self.waiting_since.is_none() {
                        self.waiting_since = Some(Instant::now());
                    }
                    Parked::Carried(message)
                }
                Ok(RouteMsg::Member { first }) => {
                    self.start(first);
                    return Ok(());
                }
                Ok(other) => return Err(format!("route message out of place from the parent: {other:?}")),
                Err(e) => return Err(format!("malformed route frame: {e}")),
            }
        } else {
            Parked::Frame(frame)
        };
        self.parked.push_back(parked);
        self.release(deliver)
    }

    /// Hands on parked frames up to the first placeholder whose message is not whole.
    fn release(&mut self, deliver: &mut dyn FnMut(Frame)) -> Result<(), String> {
        while let Some(front) = self.parked.front() {
            let message = match front {
                Parked::Carried(message) => *message,
                Parked::Frame(_) => {
                    if let Some(Parked::Frame(f)) = self.parked.pop_front() {
                        deliver(f);
                    }
                    continue;
                }
            };
            if let Some(frame) = self.ready.remove(&message) {
                self.parked.pop_front();
                // Messages before this one were all claimed or not for us.
                self.ready.retain(|&m, _| at_or_after(m, message));
                self.waiting_since = Some(Instant::now());
                deliver(frame);
                continue;
            }
            // Messages complete in order: one at or past the awaited one, completed
            // without filling it, means it was not for this node.
            if self.last_message.is_some_and(|last| at_or_after(last, message)) {
                return Err(format!(
                    "placeholder for multicast message {message}, which was not for this node"
                ));
            }
            return Ok(());
        }
        self.waiting_since = None;
        Ok(())
    }

    /// How long a placeholder may wait with no sign of life from the sender: longer
    /// than the sender takes to give up on a silent member, so that a sibling's
    /// silence costs that sibling its place, not this node.
    fn wait_limit(&self) -> Duration {
        self.config.silent_limit * 2 + Duration::from_secs(1)
    }

    /// Reads data, fires the protocol's timer and sends its answers; frames that can
    /// go on go to `deliver`. True when anything happened.
    ///
    /// # Errors
    /// The sender fell silent, went past messages this node missed, or sent one too
    /// large, or a message is malformed: the link to the parent is to be given up.
    pub fn poll(&mut self, cx: &mut Context<'_>, deliver: &mut dyn FnMut(Frame)) -> Result<bool, String> {
        let Some(receiver) = self.receiver.as_mut() else { return Ok(false) };
        let (sealer, waiting_since, sender) = (&mut self.sealer, &mut self.waiting_since, self.sender);
        let mut any = self.inbuf.read_each(&self.data, cx, READ_BUDGET, |bytes, from| {
            if from != sender {
                return;
            }
            if let Some((header, payload)) = sealer.open(bytes, from) {
                let now = Instant::now();
                receiver.handle_data(&header, payload, now);
                // The sender is alive: a placeholder waits on.
                if waiting_since.is_some() {
                    *waiting_since = Some(now);
                }
            }
        });
        let deadline = self.deadline();
        if self.timer.poll(cx, deadline) {
            any = true;
            let now = Instant::now();
            if self.waiting_since.is_some_and(|t| now.saturating_duration_since(t) >= self.wait_limit()) {
                return Err(format!(
                    "a frame sent by multicast did not arrive: the parent sent nothing for {:.1} s",
                    self.wait_limit().as_secs_f64()
                ));
            }
            if let Some(r) = self.receiver.as_mut() {
                r.handle_timeout(now);
            }
        }
        any |= self.send_answers();
        while let Some(event) = self.receiver.as_mut().and_then(Receiver::poll_event) {
            any = true;
            self.on_event(event, deliver)?;
        }
        if any && self.timer.poll(cx, self.deadline()) {
            cx.waker().wake_by_ref();
        }
        Ok(any)
    }

    fn send_answers(&mut self) -> bool {
        let mut any = false;
        while let Some((header, answer)) = self.receiver.as_mut().and_then(Receiver::poll_answer) {
            any = true;
            self.sealer.seal_answer(&header, &answer);
            if self.sealer.knob_drops() {
                continue;
            }
            if let Err(e) = self.answers.try_send_to(self.sealer.sealed(), self.sender) {
                tracing::trace!("UDP answer to {} not sent: {e}", self.sender);
            }
        }
        any
    }

    fn deadline(&self) -> Option<Instant> {
        let waiting = self.waiting_since.map(|t| t + self.wait_limit());
        [self.receiver.as_ref().and_then(Receiver::deadline), waiting].into_iter().flatten().min()
    }

    fn on_event(&mut self, event: ReceiverEvent, deliver: &mut dyn FnMut(Frame)) -> Result<(), String> {
        match event {
            ReceiverEvent::Message { message, data, .. } => {
                self.last_message = Some(message);
                if let Some(frame) = self.frame_for_me(data)? {
                    self.ready.insert(message, frame);
                }
                self.release(deliver)
            }
            ReceiverEvent::Missed { from, to } => {
                Err(format!("the parent's multicast went on without this node (messages {from} to {to})"))
            }
            ReceiverEvent::SenderSilent { message } => {
                Err(format!("the parent stopped sending multicast message {message}"))
            }
            ReceiverEvent::TooLarge { message, bytes } => {
                Err(format!("multicast message {message} of {bytes} bytes is over this node's limit"))
            }
        }
    }

    /// The frame a message carries, when this node is among those it is for.
    fn frame_for_me(&self, mut data: Bytes) -> Result<Option<Frame>, String> {
        let bad = |what: &str| format!("malformed multicast message: {what}");
        if data.len() < 4 {
            return Err(bad("no list of children"));
        }
        let n = data.get_u32_le() as usize;
        if data.len() / 4 < n {
            return Err(bad("the list of children is cut short"));
        }
        let list = data.split_to(4 * n);
        let for_me = list.chunks_exact(4).any(|c| c == self.me.to_le_bytes());
        if !for_me {
            return Ok(None);
        }
        let mut frames = decode_batch(data).map_err(|e| bad(&e.to_string()))?;
        match (frames.pop(), frames.is_empty()) {
            (Some(frame), true) if frame.header.kind == FrameKind::Data => Ok(Some(frame)),
            _ => Err(bad("not exactly one data frame")),
        }
    }
}

/// Payload bytes per fragment that fill one IPv4 packet of `mtu` bytes: less the IP
/// and UDP headers (28) and the datagram's header and tag (40), within the
/// protocol's limits (64 to 65,000).
fn fragment_for_mtu(mtu: u32) -> u32 {
    let overhead = 28 + (treecast_wire::MCAST_HEADER_LEN + treecast_wire::MCAST_TAG_LEN) as u32;
    mtu.saturating_sub(overhead).clamp(64, 65_000)
}

/// The MTU of the interface that has address `ip` (`/sys/class/net/NAME/mtu`).
fn interface_mtu(ip: Ipv4Addr) -> Option<u32> {
    let name = interface_of(ip)?.0;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?.trim().parse().ok()
}

/// True when `peer` is on the same IPv4 subnet as this host's `local` address (the
/// interface that has `local`, with its netmask), or both are loopback addresses.
pub fn shares_subnet(local: IpAddr, peer: IpAddr) -> bool {
    if local.is_loopback() && peer.is_loopback() {
        return true;
    }
    let (IpAddr::V4(local), IpAddr::V4(peer)) = (local, peer) else { return false };
    interface_of(local).is_some_and(|(_, mask)| {
        let m = u32::from(mask);
        u32::from(local) & m == u32::from(peer) & m
    })
}

/// The name and netmask of the interface that has address `ip`.
fn interface_of(ip: Ipv4Addr) -> Option<(String, Ipv4Addr)> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    #[allow(unsafe_code)]
    // SAFETY: getifaddrs stores a list it allocated through the pointer, which is
    // valid and writable; the list is freed below with freeifaddrs, once.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        #[allow(unsafe_code)]
        // SAFETY: `cur` is a non-null entry of the list getifaddrs returned, alive
        // until freeifaddrs; an address whose family is AF_INET points to a
        // sockaddr_in; a non-null name is a NUL-terminated string owned by the list.
        let entry = unsafe {
            let e = &*cur;
            cur = e.ifa_next;
            let v4 = |a: *mut libc::sockaddr| {
                (!a.is_null() && i32::from((*a).sa_family) == libc::AF_INET).then(|| {
                    let sin = &*(a as *const libc::sockaddr_in);
                    std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))
                })
            };
            let name = (!e.ifa_name.is_null())
                .then(|| std::ffi::CStr::from_ptr(e.ifa_name).to_string_lossy().into_owned());
            (v4(e.ifa_addr), v4(e.ifa_netmask), name)
        };
        if let (Some(addr), Some(mask), Some(name)) = entry {
            if addr == ip {
                found = Some((name, mask));
                break;
            }
        }
    }
    #[allow(unsafe_code)]
    // SAFETY: `list` came from getifaddrs and is freed once; no entry is used after.
    unsafe {
        libc::freeifaddrs(list)
    };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_fill_the_mtu_and_stay_within_the_protocols_limits() {
        assert_eq!(fragment_for_mtu(1500), 1432, "Ethernet");
        assert_eq!(fragment_for_mtu(9000), 8932, "jumbo frames");
        assert_eq!(fragment_for_mtu(65_536), 65_000, "loopback");
        assert_eq!(fragment_for_mtu(0), 64);
    }

    #[test]
    fn each_node_gets_a_port_of_its_own_from_the_base_or_any_port() {
        assert_eq!(node_port(0, 7), 0);
        assert_eq!(node_port(40_000, 0), 40_000);
        assert_eq!(node_port(40_000, 7), 40_007);
        assert_eq!(node_port(65_535, 7), 65_535, "one port: every node on it");
        assert_eq!(node_port(65_530, 6), 65_530, "wraps within the range");
    }

    #[test]
    fn each_node_gets_a_multicast_group_of_its_own_and_loopback_never_broadcasts() {
        let lo = Ipv4Addr::LOCALHOST;
        let lan = Ipv4Addr::new(10, 0, 0, 1);
        let base: IpAddr = "239.255.84.67".parse().unwrap_or(super::super::DEFAULT_GROUP);
        assert_eq!(group_address(base, 0, lan), Ipv4Addr::new(239, 255, 84, 67));
        assert_eq!(group_address(base, 300, lan), Ipv4Addr::new(239, 255, 85, 111));
        assert_eq!(group_address(base, 0xffff, lan), Ipv4Addr::new(239, 255, 84, 66), "wraps in the /16");
        let broadcast = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 255));
        assert_eq!(group_address(broadcast, 7, lan), Ipv4Addr::new(10, 0, 0, 255));
        assert!(group_address(broadcast, 7, lo).is_multicast());
    }
}
