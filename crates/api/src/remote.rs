//! Two running networks linked through their front-ends: each sees the other's
//! ranks as a remote group, and their back-ends send each other messages
//! (`BackEnd::send_to_rank`) as they do within one network.
//!
//! One network opens a port ([`Network::open_network_port`]): its front-end
//! listens, and writes a port file (mode 0600) naming where, with a secret made for
//! that port alone. The other network's front-end reads the file
//! ([`Network::connect_network`]) and connects; both prove the port's secret with
//! the challenge–response every link uses, then tell each other their session,
//! their number of ranks and the number each gives the other (a hello). From then
//! on each front-end's core passes messages for the other's ranks over that link
//! (`treecast_proto` module `remote`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use treecast_driver::lock;
use treecast_proto::{remote_base, Command, CommandError, Peer, RemoteSpec};
use treecast_transport::{handshake, Listener, Secret, Stream};
use treecast_wire::{
    decode_network_hello, encode_network_hello, network_hello_len, NetworkHello, NETWORK_HELLO_HEAD,
};

use crate::attach::AttachFile;
use crate::{ApiError, AttachError, AttachInfo, Group, Network};

/// How long [`NetworkPort::accept`] and [`Network::connect_network`] wait, by default.
pub const DEFAULT_NETWORK_LIMIT: Duration = Duration::from_secs(30);

/// Another running network linked to this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNetwork {
    index: u32,
    /// Which link of this front-end this was: a number is given again only long
    /// after, and then to another link.
    serial: u64,
    session: String,
    group: Group,
}

impl RemoteNetwork {
    /// This front-end's number for the other network.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The other network's session.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// How many ranks the other network had when the two were linked (its ranks 0
    /// to `size - 1`; ranks it spawned later are not reached from here).
    pub fn size(&self) -> u32 {
        u32::try_from(self.group.size()).unwrap_or(u32::MAX)
    }

    /// Its ranks as this network numbers them: what this network's back-ends send
    /// to. Group rank i is the other network's rank i.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The number this network gives the other network's rank `theirs`.
    pub fn rank(&self, theirs: u32) -> Option<u32> {
        (theirs < self.size()).then(|| remote_base(self.index) + theirs)
    }

    /// The other network's own number for `ours`, one of [`RemoteNetwork::group`]'s ranks.
    pub fn their_rank(&self, ours: u32) -> Option<u32> {
        ours.checked_sub(remote_base(self.index)).filter(|&r| r < self.size())
    }
}

/// Where a network waits for other networks to connect ([`Network::open_network_port`]).
/// Dropping it stops listening and removes its port file.
#[derive(Debug)]
pub struct NetworkPort {
    listener: Listener,
    secret: Secret,
    path: PathBuf,
    _file: AttachFile,
}

impl NetworkPort {
    /// The port file other networks connect with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits (at most `limit`) for the next network to connect with this port's
    /// file, and links it to `net`. Connections that do not prove the port's
    /// secret are refused and logged, and the wait goes on.
    ///
    /// # Errors
    /// [`ApiError::Timeout`] when no network linked within `limit`;
    /// [`ApiError::RemoteRefused`] when the front-end that proved the secret
    /// cannot be linked (another protocol version, too many ranks or networks);
    /// [`ApiError::Closed`] when `net` is over by then.
    ///
    /// Cancel safety: cancel safe; a connection under way is dropped.
    pub async fn accept(&self, net: &Network, limit: Duration) -> Result<RemoteNetwork, ApiError> {
        let deadline = tokio::time::Instant::now() + limit;
        // Handshakes run side by side, so that connections that never finish theirs
        // cannot hold up the network that does; past MAX_PENDING_HANDSHAKES the oldest
        // gives way.
        let mut handshakes = tokio::task::JoinSet::new();
        let mut pending = std::collections::VecDeque::new();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((mut stream, peer)) => {
                        pending.retain(|h: &tokio::task::AbortHandle| !h.is_finished());
                        if pending.len() >= MAX_PENDING_HANDSHAKES {
                            if let Some(oldest) = pending.pop_front() {
                                oldest.abort();
                            }
                        }
                        let secret = self.secret.clone();
                        pending.push_back(handshakes.spawn(async move {
                            let proved = handshake::accept(&mut stream, &secret, &peer, HANDSHAKE_LIMIT).await;
                            (proved, stream, peer)
                        }));
                    }
                    Err(e) => {
                        // Out of descriptors, or an aborted connection: try again shortly.
                        tracing::warn!("network port {}: {e}", self.path.display());
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = handshakes.join_next() => match done {
                    Ok((Ok(_), stream, peer)) => {
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        return link(net, stream, peer, left.max(HELLO_LIMIT)).await;
                    }
                    Ok((Err(e), _, peer)) => {
                        tracing::warn!("network port {}: refused {peer}: {e}", self.path.display())
                    }
                    Err(_) => {}
                },
                () = tokio::time::sleep_until(deadline) => return Err(ApiError::Timeout(limit)),
            }
        }
    }
}

/// How long one connection to a network port may take to prove the port's secret.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// How many connections to a network port may be proving the secret at once.
const MAX_PENDING_HANDSHAKES: usize = 16;
/// The least time the two front-ends have to exchange hellos once authenticated.
const HELLO_LIMIT: Duration = Duration::from_secs(1);

impl Network {
    /// Opens a port other running networks connect to ([`Network::connect_network`]):
    /// the front-end listens on an abstract Unix socket of this host, or with
    /// `listen`, on a TCP port of that address (never every address unless it is
    /// the unspecified one), and writes a port file at `path` naming it, with a
    /// secret made for this port alone (mode 0600; no secret goes on a command
    /// line). Then [`NetworkPort::accept`] links each network that connects.
    ///
    /// # Errors
    /// [`ApiError::Join`] when nothing can listen; [`ApiError::Attach`] when the
    /// file cannot be written.
    pub async fn open_network_port(
        &self,
        path: &Path,
        listen: Option<IpAddr>,
    ) -> Result<NetworkPort, ApiError> {
        let listener = match listen {
            Some(ip) => Listener::tcp(ip).await,
            None => Listener::unix(),
        }
        .map_err(|e| ApiError::Join(e.into()))?;
        let address = listener.address().map_err(|e| ApiError::Join(e.into()))?;
        let secret = Secret::generate();
        let info = AttachInfo {
            session: self.session().to_owned(),
            secret: secret.clone(),
            size: self.spawner.ranks_given(),
            points: Vec::new(),
            base: 0,
            network: Some(address),
        };
        info.write(path)?;
        let file = AttachFile::written(path)?;
        Ok(NetworkPort { listener, secret, path: path.to_path_buf(), _file: file })
    }

    /// Links this network to the one whose port file is at `port` (see
    /// [`Network::open_network_port`]), waiting at most `limit`. Both front-ends
    /// see the other's ranks as a remote group.
    ///
    /// # Errors
    /// [`ApiError::Attach`] for a file that is missing, not private, or not a
    /// network's port; [`ApiError::Join`] when the other front-end cannot be
    /// reached or does not prove the port's secret; [`ApiError::RemoteRefused`]
    /// as [`NetworkPort::accept`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn connect_network(&self, port: &Path, limit: Duration) -> Result<RemoteNetwork, ApiError> {
        let info = AttachInfo::read(port)?;
        let Some(address) = info.network else {
            return Err(AttachError::NotNetworkPort { path: port.to_path_buf() }.into());
        };
        let deadline = tokio::time::Instant::now() + limit;
        let stream =
            treecast_driver::connect_to(&address, 0, &info.secret, limit).await.map_err(ApiError::Join)?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        link(self, stream, address, left.max(HELLO_LIMIT)).await
    }

    /// Closes the link to `remote`; both front-ends report
    /// [`crate::Event::NetworkClosed`], and messages to its ranks are undeliverable
    /// from then on.
    ///
    /// # Errors
    /// [`ApiError::Refused`] when it is not linked (any more).
    pub fn disconnect_network(&self, remote: &RemoteNetwork) -> Result<(), ApiError> {
        let mut d = lock(&self.shared);
        if !d.tool().remotes.is_live(remote.index, remote.serial) {
            let gone = CommandError::NotNow("that network is not linked to this one any more");
            return Err(ApiError::Refused(Box::new(gone)));
        }
        d.command(Command::CloseRemote { index: remote.index }).map_err(|e| ApiError::Refused(Box::new(e)))
    }
}

/// A network number taken for a link under way: given back if the link is not
/// made (an error, or the call dropped while it waits).
struct Taken<'a> {
    net: &'a Network,
    index: u32,
    made: bool,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if !self.made {
            lock(&self.net.shared).tool().remotes.give_back(self.index);
        }
    }
}

/// Exchanges hellos over an authenticated `stream` and hands it to `net`'s driver.
async fn link(
    net: &Network,
    mut stream: Stream,
    peer: String,
    limit: Duration,
) -> Result<RemoteNetwork, ApiError> {
    let (index, serial) = lock(&net.shared).tool().remotes.take()?;
    let mut taken = Taken { net, index, made: false };
    let own_size = net.spawner.ranks_given();
    let ours = NetworkHello { session: net.session().to_owned(), size: own_size, index };
    let theirs = tokio::time::timeout(limit, exchange(&mut stream, &ours))
        .await
        .map_err(|_| ApiError::Timeout(limit))?
        .map_err(|e| refused(&peer, e))?;
    let spec = RemoteSpec { index, size: theirs.size, their_index: theirs.index, own_size };
    spec.check().map_err(|e| refused(&peer, e.to_string()))?;
    let socket = stream
        .into_socket()
        .map_err(|source| ApiError::Link { what: "taking over the link to another network", source })?;
    let name = format!("network {} at {peer}", theirs.session);
    {
        let mut d = lock(&net.shared);
        if let Some(reason) = d.tool().over.clone() {
            return Err(ApiError::Closed(reason));
        }
        d.add_link(socket, Peer::Remote(spec), name)
            .map_err(|source| ApiError::Link { what: "registering the link to another network", source })?;
    }
    taken.made = true;
    let ranks = (remote_base(index)..remote_base(index) + theirs.size).collect();
    let group = Group::new(net.spawner.group_id(), ranks);
    Ok(RemoteNetwork { index, serial, session: theirs.session, group })
}

/// Sends `ours` and reads the other front-end's hello.
async fn exchange(stream: &mut Stream, ours: &NetworkHello) -> Result<NetworkHello, String> {
    stream.write_all(&encode_network_hello(ours)).await.map_err(|e| format!("sending the hello: {e}"))?;
    let mut bytes = vec![0u8; NETWORK_HELLO_HEAD];
    stream.read_exact(&mut bytes).await.map_err(|e| format!("reading the hello: {e}"))?;
    let len = network_hello_len(&bytes).map_err(|e| e.to_string())?;
    bytes.resize(len, 0);
    stream
        .read_exact(&mut bytes[NETWORK_HELLO_HEAD..])
        .await
        .map_err(|e| format!("reading the hello: {e}"))?;
    decode_network_hello(&bytes).map_err(|e| e.to_string())
}

fn refused(peer: &str, why: String) -> ApiError {
    ApiError::RemoteRefused { peer: peer.to_owned(), why }
}

/// Whether `group` has ranks of other networks: collectives do not cross networks.
pub(crate) fn remote_members(group: &Group) -> bool {
    group.ranks().iter().any(|&r| is_remote(r))
}

/// Whether `rank` is another network's, as this one numbers it.
pub(crate) fn is_remote(rank: u32) -> bool {
    rank >= treecast_proto::REMOTE_BASE
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn remote_ranks_map_both_ways_within_the_other_networks_size() {
        let r = RemoteNetwork {
            index: 2,
            serial: 1,
            session: "s".into(),
            group: Group::new(1, (remote_base(2)..remote_base(2) + 3).collect()),
        };
        assert_eq!(r.rank(0), Some(remote_base(2)));
        assert_eq!(r.rank(3), None);
        assert_eq!(r.their_rank(remote_base(2) + 2), Some(2));
        assert_eq!(r.their_rank(remote_base(2) + 3), None);
        assert_eq!(r.their_rank(5), None);
        assert!(remote_members(r.group()));
        assert!(!remote_members(&Group::new(0, vec![0, 1])));
    }
}
