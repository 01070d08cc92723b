//! Which host names mean this machine: those are started with fork/exec, never
//! through ssh, whatever name a topology file or host list uses for them.
//!
//! A name is this machine when it is `localhost`, this host's name, an address in
//! 127.0.0.0/8 or `::1`, an address of one of this machine's interfaces, or a name
//! that resolves to one of those (the FQDN, an alias in `/etc/hosts`). Addresses are
//! compared, as MRNet does, so every spelling of one machine gets the same answer.
//! An address is this machine's when a socket can be bound to it: the kernel keeps
//! the list of interface addresses, and binding sends nothing.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::mpsc;
use std::time::Duration;

/// Longest wait for the resolver, for all the names of one call together; a name it
/// cannot answer in time is taken as another host (ssh then reports what is wrong).
const RESOLVE_LIMIT: Duration = Duration::from_secs(3);

/// Remembers, per host name, whether it is this machine: each name is resolved once.
#[derive(Debug, Default, Clone)]
pub struct LocalHosts {
    known: HashMap<String, bool>,
    /// This machine's host name, read once.
    own_name: Option<String>,
}

impl LocalHosts {
    /// An empty cache.
    pub fn new() -> Self {
        LocalHosts::default()
    }

    /// True when `host` names this machine (see the module documentation). Blocks
    /// on the resolver for a name not seen before (at most a few seconds).
    pub fn is_local(&mut self, host: &str) -> bool {
        self.resolve_all([host]);
        self.cached(host).unwrap_or(false)
    }

    /// Finds out which of `hosts` are this machine, resolving the names not seen before
    /// all at once: the wait is the slowest name's (at most a few seconds), not the sum.
    pub fn resolve_all<'a>(&mut self, hosts: impl IntoIterator<Item = &'a str>) {
        let own = self.own_name.get_or_insert_with(this_host_name).to_ascii_lowercase();
        let mut unknown = Vec::new();
        for host in hosts {
            let key = key_of(host);
            if self.known.contains_key(&key) || unknown.contains(&key) {
                continue;
            }
            match names_this_machine_at_once(&key, &own) {
                Some(local) => {
                    self.known.insert(key, local);
                }
                None => unknown.push(key),
            }
        }
        let resolved = resolve(&unknown);
        for (key, addrs) in unknown.into_iter().zip(resolved) {
            let local = addrs.iter().any(|a| is_local_address(a.ip()));
            self.known.insert(key, local);
        }
    }

    /// The answer for `host` if it was resolved before.
    pub fn cached(&self, host: &str) -> Option<bool> {
        self.known.get(&key_of(host)).copied()
    }
}

/// The cache key of `host`: lower case, without an ssh user and a trailing dot.
fn key_of(host: &str) -> String {
    let host = treecast_topology::hostlist::bare_host(host);
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// This machine's host name, as the kernel has it.
pub fn this_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

/// Whether `host` (a cache key) is this machine, when that can be told without the
/// resolver: `None` for a name that must be resolved.
fn names_this_machine_at_once(host: &str, own_name: &str) -> Option<bool> {
    if host.is_empty() {
        return Some(false);
    }
    if host == "localhost" || host.ends_with(".localhost") || host == own_name {
        return Some(true);
    }
    let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    literal.parse::<IpAddr>().ok().map(is_local_address)
}

/// True for loopback addresses and the addresses of this machine's interfaces.
pub fn is_local_address(ip: IpAddr) -> bool {
    if ip.is_loopback() {
        return true;
    }
    if ip.is_unspecified() || ip.is_multicast() {
        return false;
    }
    // Succeeds only for an address assigned here (unless the administrator allowed
    // binding foreign addresses, in which case ssh would reach this machine anyway).
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// The addresses each of `names` resolves to, resolved side by side; a name whose
/// answer has not come within [`RESOLVE_LIMIT`] of the start gets none.
fn resolve(names: &[String]) -> Vec<Vec<SocketAddr>> {
    let (tx, rx) = mpsc::channel();
    for (i, name) in names.iter().enumerate() {
        let (tx, name) = (tx.clone(), name.clone());
        // A resolver that hangs (an unreachable DNS server) must not hold up the start:
        // its thread is left to finish on its own and its answer is dropped.
        let _ = std::thread::Builder::new().name("resolve".into()).spawn(move || {
            let addrs: Vec<SocketAddr> =
                (name.as_str(), 0u16).to_socket_addrs().map(Iterator::collect).unwrap_or_default();
            let _ = tx.send((i, addrs));
        });
    }
    drop(tx);
    let mut out = vec![Vec::new(); names.len()];
    let deadline = std::time::Instant::now() + RESOLVE_LIMIT;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok((i, addrs)) => out[i] = addrs,
            Err(_) => break,
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_this_machine_is_local() {
        let mut hosts = LocalHosts::new();
        for name in ["localhost", "LOCALHOST", "127.0.0.1", "127.0.0.2", "127.1.2.3", "::1", "[::1]"] {
            assert!(hosts.is_local(name), "{name} should be this machine");
        }
        assert!(hosts.is_local(&this_host_name()), "the host name");
        assert!(hosts.is_local(&format!("{}.", this_host_name())), "the host name with a root dot");
        assert!(hosts.is_local("alice@localhost"), "an ssh user does not change the host");
    }

    #[test]
    fn other_machines_are_not_local() {
        let mut hosts = LocalHosts::new();
        // Documentation addresses (RFC 5737) are never assigned to an interface here.
        for name in ["192.0.2.1", "198.51.100.7", "0.0.0.0", "224.0.0.1", ""] {
            assert!(!hosts.is_local(name), "{name:?} should not be this machine");
        }
    }

    #[test]
    #[cfg_attr(not(has_route), ignore = "no route off loopback on this machine")]
    fn an_interface_address_is_local() {
        // Whatever address the kernel would use towards a documentation network is one
        // of this machine's (connecting a UDP socket sends nothing).
        let probe = UdpSocket::bind("0.0.0.0:0").unwrap();
        probe.connect("192.0.2.1:9").expect("no route off loopback, but the build found one: rebuild");
        let own = probe.local_addr().unwrap().ip();
        assert!(LocalHosts::new().is_local(&own.to_string()), "{own} is an interface address");
    }

    #[test]
    fn answers_are_cached_by_host_name() {
        let mut hosts = LocalHosts::new();
        assert_eq!(hosts.cached("127.0.0.1"), None);
        assert!(hosts.is_local("127.0.0.1"));
        assert_eq!(hosts.cached("127.0.0.1"), Some(true));
        assert_eq!(hosts.cached("bob@127.0.0.1"), Some(true));
    }
}
