//! The thin UDP driver of the multicast protocol: a socket that sends each
//! datagram signed to the group and receives only datagrams of the session, and
//! the loops that run a [`Sender`] or a [`Receiver`] on it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::UdpSocket;
use treecast_wire::{decode_mcast, encode_mcast, McastAnswer, McastHeader};

use super::{McastConfig, McastKey, Receiver, ReceiverEvent, Sender, SenderEvent};
use crate::TransportError;

/// Largest datagram read: the UDP maximum.
pub(crate) const MAX_DATAGRAM: usize = 65_536;

/// What an endpoint saw, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams sent (one per destination).
    pub sent: u64,
    /// Datagrams of the session received.
    pub received: u64,
    /// Datagrams dropped on arrival: not decodable, or not signed with the session's key.
    pub rejected: u64,
    /// Datagrams the drop test knob threw away instead of sending.
    pub knob_dropped: u64,
}

/// What every socket of the route shares: signing and checking datagrams, the drop
/// knob, and the counts.
#[derive(Debug)]
pub(crate) struct Sealer {
    key: McastKey,
    /// The drop knob (`TREECAST_UDP_DROP`): a seeded chance to not send a datagram.
    drop: Option<(StdRng, f64)>,
    out: Vec<u8>,
    /// An answer's payload, before it is sealed.
    answer_payload: Vec<u8>,
    pub(crate) stats: EndpointStats,
}

impl Sealer {
    pub(crate) fn new(key: McastKey, config: &McastConfig) -> Sealer {
        let drop = (config.drop > 0.0).then(|| (StdRng::seed_from_u64(config.drop_seed), config.drop));
        Sealer { key, drop, out: Vec::new(), answer_payload: Vec::new(), stats: EndpointStats::default() }
    }

    /// Encodes and signs a datagram; send [`Sealer::sealed`] to each destination
    /// that [`Sealer::knob_drops`] spares.
    pub(crate) fn seal(&mut self, header: &McastHeader, payload: &[u8]) {
        encode_mcast(header, payload, &mut self.out);
        self.key.sign(&mut self.out);
    }

    /// Encodes and signs an ACK or NACK with its payload, as [`Sealer::seal`] does.
    pub(crate) fn seal_answer(&mut self, header: &McastHeader, answer: &McastAnswer) {
        let mut payload = std::mem::take(&mut self.answer_payload);
        payload.clear();
        answer.encode(&mut payload);
        self.seal(header, &payload);
        self.answer_payload = payload;
    }

    pub(crate) fn sealed(&self) -> &[u8] {
        &self.out
    }

    /// The drop knob's draw for one destination (counted when it drops).
    pub(crate) fn knob_drops(&mut self) -> bool {
        let Some((rng, p)) = self.drop.as_mut() else { return false };
        let dropped = rng.gen_bool(*p);
        self.stats.knob_dropped += u64::from(dropped);
        dropped
    }

    /// The datagram's header and payload when it is of the session; else `None`,
    /// logged and counted.
    pub(crate) fn open<'a>(&mut self, bytes: &'a [u8], from: SocketAddr) -> Option<(McastHeader, &'a [u8])> {
        match decode_mcast(bytes) {
            Ok(d) if self.key.verify(&d) => {
                self.stats.received += 1;
                return Some((d.header, d.payload));
            }
            Ok(_) => {
                tracing::debug!("UDP datagram from {from} dropped: its tag does not match the session's key")
            }
            Err(e) => tracing::debug!("UDP datagram from {from} dropped: {e}"),
        }
        self.stats.rejected += 1;
        None
    }
}

/// A UDP socket speaking the multicast protocol's datagrams.
#[derive(Debug)]
pub struct UdpEndpoint {
    socket: UdpSocket,
    sealer: Sealer,
    inbuf: Vec<u8>,
}

impl UdpEndpoint {
    /// Binds `addr` (a port of 0 picks one). Broadcast is allowed, so that a
    /// group's address may be the subnet's broadcast address.
    ///
    /// # Errors
    /// [`TransportError::Io`] when the address cannot be bound.
    pub async fn bind(
        addr: SocketAddr,
        key: McastKey,
        config: &McastConfig,
    ) -> Result<UdpEndpoint, TransportError> {
        let io = |what: String| move |source| TransportError::Io { what, source };
        let socket = UdpSocket::bind(addr).await.map_err(io(format!("binding UDP {addr}")))?;
        socket.set_broadcast(true).map_err(io(format!("allowing broadcast on UDP {addr}")))?;
        Ok(UdpEndpoint { socket, sealer: Sealer::new(key, config), inbuf: vec![0; MAX_DATAGRAM] })
    }

    /// The address it is bound to.
    ///
    /// # Errors
    /// [`TransportError::Io`] from the OS.
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        self.socket
            .local_addr()
            .map_err(|source| TransportError::Io { what: "reading a UDP address".into(), source })
    }

    /// What it saw so far.
    pub fn stats(&self) -> EndpointStats {
        self.sealer.stats
    }

    /// Sends one datagram, signed once, to every address of `to`. A datagram the
    /// kernel refuses (a full buffer) is lost like one lost on the wire: the
    /// protocol resends it.
    pub async fn send(&mut self, header: &McastHeader, payload: &[u8], to: &[SocketAddr]) {
        self.sealer.seal(header, payload);
        self.send_sealed(to).await;
    }

    /// Sends an ACK or NACK with its payload to `to`, as [`UdpEndpoint::send`] does.
    pub async fn send_answer(&mut self, header: &McastHeader, answer: &McastAnswer, to: SocketAddr) {
        self.sealer.seal_answer(header, answer);
        self.send_sealed(&[to]).await;
    }

    async fn send_sealed(&mut self, to: &[SocketAddr]) {
        for dest in to {
            if self.sealer.knob_drops() {
                continue;
            }
            match self.socket.send_to(self.sealer.sealed(), dest).await {
                Ok(_) => self.sealer.stats.sent += 1,
                Err(e) => tracing::debug!("UDP datagram to {dest} not sent: {e}"),
            }
        }
    }

    /// The next datagram of the session, with its sender's address; others are
    /// dropped and counted. Cancel safe.
    ///
    /// # Errors
    /// [`TransportError::Io`] when the socket fails.
    pub async fn recv(&mut self) -> Result<(McastHeader, Bytes, SocketAddr), TransportError> {
        loop {
            let (n, from) = self
                .socket
                .recv_from(&mut self.inbuf)
                .await
                .map_err(|source| TransportError::Io { what: "receiving a UDP datagram".into(), source })?;
            if let Some((header, payload)) = self.sealer.open(&self.inbuf[..n], from) {
                return Ok((header, Bytes::copy_from_slice(payload), from));
            }
        }
    }
}

/// Runs `sender` until every message queued in it has completed (or its
/// receivers were reported lost), multicasting to `group`; returns its events.
///
/// # Errors
/// The socket failed.
pub async fn drive_sender(
    ep: &mut UdpEndpoint,
    sender: &mut Sender,
    group: &[SocketAddr],
) -> Result<Vec<SenderEvent>, TransportError> {
    let mut events = Vec::new();
    loop {
        while let Some((header, payload)) = sender.poll_datagram() {
            ep.send(&header, &payload, group).await;
        }
        events.extend(std::iter::from_fn(|| sender.poll_event()));
        if sender.is_idle() {
            return Ok(events);
        }
        // A sender with a message under way always has a deadline (its silent limit).
        let deadline = sender.deadline().unwrap_or_else(|| Instant::now() + Duration::from_millis(100));
        tokio::select! {
            got = ep.recv() => {
                let (header, payload, _) = got?;
                // The decoder checked every answer's payload: one that fails is not an answer.
                if let Ok(answer) = McastAnswer::decode(&header, &payload) {
                    sender.handle_answer(&header, &answer, Instant::now());
                }
            }
            () = tokio::time::sleep_until(deadline.into()) => sender.handle_timeout(Instant::now()),
        }
    }
}

/// Runs `receiver`, answering the sender at `sender_addr`, and hands each event to
/// `on_event` until it returns false.
///
/// # Errors
/// The socket failed, or nothing came for `idle_limit` while no message was under way.
pub async fn drive_receiver(
    ep: &mut UdpEndpoint,
    receiver: &mut Receiver,
    sender_addr: SocketAddr,
    idle_limit: Duration,
    mut on_event: impl FnMut(ReceiverEvent) -> bool,
) -> Result<(), TransportError> {
    // Only this group's data moves it: another group's broadcasts on the subnet do not.
    let mut idle_until = Instant::now() + idle_limit;
    loop {
        while let Some((header, answer)) = receiver.poll_answer() {
            ep.send_answer(&header, &answer, sender_addr).await;
        }
        while let Some(event) = receiver.poll_event() {
            if !on_event(event) {
                return Ok(());
            }
        }
        let deadline = receiver.deadline();
        tokio::select! {
            got = ep.recv() => {
                let (header, payload, _) = got?;
                if header.group == receiver.group() {
                    idle_until = Instant::now() + idle_limit;
                }
                receiver.handle_data(&header, &payload, Instant::now());
            }
            () = tokio::time::sleep_until(deadline.unwrap_or(idle_until).into()) => {
                if deadline.is_none() {
                    return Err(TransportError::Timeout { what: format!("multicast data from {sender_addr}"), secs: idle_limit.as_secs_f64() });
                }
                receiver.handle_timeout(Instant::now());
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Secret;

    fn message(len: usize, seed: u8) -> Bytes {
        (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect::<Vec<u8>>().into()
    }

    /// Four receivers on loopback, every datagram dropped at 5 % by the knob both
    /// ways: every message arrives whole, in order, at every receiver.
    #[tokio::test]
    async fn messages_of_every_size_cross_real_udp_sockets_despite_dropped_datagrams() {
        let config = McastConfig { drop: 0.05, drop_seed: 11, ..McastConfig::default() };
        let key = McastKey::new(&Secret::from_bytes([3; 32]));
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let f = config.fragment as usize;
        let messages: Vec<Bytes> =
            [0, 1, f, f + 1, 300_000, 0].iter().enumerate().map(|(i, &n)| message(n, i as u8)).collect();
        let mut sender_ep = UdpEndpoint::bind(loopback, key.clone(), &config).await.unwrap();
        let sender_addr = sender_ep.local_addr().unwrap();
        let mut group = Vec::new();
        let mut tasks = Vec::new();
        for r in 0..4u32 {
            let receiver_config = McastConfig { drop_seed: u64::from(r), ..config };
            let mut ep = UdpEndpoint::bind(loopback, key.clone(), &receiver_config).await.unwrap();
            group.push(ep.local_addr().unwrap());
            let expected = messages.len();
            tasks.push(tokio::spawn(async move {
                let mut receiver = Receiver::new(receiver_config, 10 + r, 1, 0);
                let mut got = Vec::new();
                drive_receiver(&mut ep, &mut receiver, sender_addr, Duration::from_secs(20), |e| {
                    if let ReceiverEvent::Message { data, .. } = e {
                        got.push(data);
                    }
                    got.len() < expected
                })
                .await
                .unwrap();
                // Answer re-sent last fragments a little longer, so the sender's last
                // final ACK is not the only one lost.
                let _ = tokio::time::timeout(
                    Duration::from_millis(300),
                    drive_receiver(&mut ep, &mut receiver, sender_addr, Duration::from_secs(1), |_| true),
                )
                .await;
                (got, ep.stats())
            }));
        }
        let mut sender = Sender::new(config, 1, 10..14);
        for m in &messages {
            sender.send(7, m.clone(), Instant::now()).unwrap();
        }
        let events =
            tokio::time::timeout(Duration::from_secs(60), drive_sender(&mut sender_ep, &mut sender, &group))
                .await
                .unwrap()
                .unwrap();
        assert_eq!(events.len(), messages.len(), "{events:?}");
        assert!(events.iter().all(|e| matches!(e, SenderEvent::Completed { stream: 7, .. })), "{events:?}");
        for t in tasks {
            let (got, _) = t.await.unwrap();
            assert_eq!(got, messages);
        }
        let stats = sender.stats();
        assert!(stats.retransmitted > 0 && sender_ep.stats().knob_dropped > 0, "{stats:?}");
    }

    #[tokio::test]
    async fn a_datagram_of_another_session_is_dropped_before_the_protocol_sees_it() {
        let config = McastConfig::default();
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut ours =
            UdpEndpoint::bind(loopback, McastKey::new(&Secret::from_bytes([1; 32])), &config).await.unwrap();
        let mut theirs =
            UdpEndpoint::bind(loopback, McastKey::new(&Secret::from_bytes([2; 32])), &config).await.unwrap();
        let mut friend =
            UdpEndpoint::bind(loopback, McastKey::new(&Secret::from_bytes([1; 32])), &config).await.unwrap();
        let to = [ours.local_addr().unwrap()];
        theirs.send(&McastHeader::data(1, 0, 0, 0, false, 0), b"evil", &to).await;
        friend.send(&McastHeader::data(1, 0, 0, 0, false, 0), b"good", &to).await;
        let (_, payload, _) =
            tokio::time::timeout(Duration::from_secs(5), ours.recv()).await.unwrap().unwrap();
        assert_eq!(&payload[..], b"good");
        assert_eq!(ours.stats().rejected, 1);
    }
}
