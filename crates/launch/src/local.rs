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

/// Longest wait for the resolver on one name; a name it cannot answer in time is
/// taken as another host (ssh then reports what is wrong with it).
const RESOLVE_LIMIT: Duration = Duration::from_secs(3);

/// Remembers, per host name, whether it is this machine: each name is resolved once.
#[derive(Debug, Default, Clone)]
pub struct LocalHosts {
    known: HashMap<String, bool>,
}

impl LocalHosts {
    /// An empty cache.
    pub fn new() -> Self {
        LocalHosts::default()
    }

    /// True when `host` names this machine (see the module documentation). Blocks
    /// on the resolver for names not seen before (at most a few seconds each).
    pub fn is_local(&mut self, host: &str) -> bool {
        let key = host_part(host).to_ascii_lowercase();
        if let Some(known) = self.known.get(&key) {
            return *known;
        }
        let local = names_this_machine(&key);
        self.known.insert(key, local);
        local
    }

    /// The answer for `host` if [`LocalHosts::is_local`] was asked before.
    pub fn cached(&self, host: &str) -> Option<bool> {
        self.known.get(&host_part(host).to_ascii_lowercase()).copied()
    }
}

/// `host` without an ssh user (`user@host`) and without a trailing dot.
fn host_part(host: &str) -> &str {
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    host.strip_suffix('.').unwrap_or(host)
}

/// This machine's host name, as the kernel has it.
pub fn this_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

/// True when `host` (lower case, no user) is this machine.
fn names_this_machine(host: &str) -> bool {
    if host.is_empty() {
        return false;
    }
    if host == "localhost" || host.ends_with(".localhost") || host.eq_ignore_ascii_case(&this_host_name()) {
        return true;
    }
    let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return is_local_address(ip);
    }
    resolve(host).into_iter().any(|a| is_local_address(a.ip()))
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

/// The addresses `host` resolves to, or none if the resolver fails or takes too long.
fn resolve(host: &str) -> Vec<SocketAddr> {
    let (tx, rx) = mpsc::channel();
    let name = host.to_owned();
    // A resolver that hangs (an unreachable DNS server) must not hold up the start:
    // the thread is left to finish on its own and its answer is dropped.
    let spawned = std::thread::Builder::new().name("resolve".into()).spawn(move || {
        let addrs = (name.as_str(), 0u16).to_socket_addrs().map(Iterator::collect).unwrap_or_default();
        let _ = tx.send(addrs);
    });
    if spawned.is_err() {
        return Vec::new();
    }
    rx.recv_timeout(RESOLVE_LIMIT).unwrap_or_default()
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
    fn an_interface_address_is_local() {
        // Whatever address the kernel would use towards a documentation network is one
        // of this machine's (connecting a UDP socket sends nothing).
        let probe = UdpSocket::bind("0.0.0.0:0").unwrap();
        if probe.connect("192.0.2.1:9").is_err() {
            eprintln!("skipped: no route off loopback on this machine");
            return;
        }
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
