//! Which of this host's addresses lies on each rail a striped link spreads over.
//!
//! A rail is named the same way on every host of a tree, so that one setting
//! serves them all: an IP subnet (`10.1.0.0/16`, each host has its own address in
//! it) or an interface name (`ib1`, the same on every host of a homogeneous cluster).

use std::net::IpAddr;

use crate::TransportError;

/// One rail: a subnet, or an interface by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rail {
    /// Addresses whose first `prefix` bits are those of `net`.
    Subnet {
        /// The subnet's address.
        net: IpAddr,
        /// Its prefix length.
        prefix: u8,
    },
    /// The addresses of the interface of that name.
    Interface(String),
}

/// Longest interface name Linux takes (`IFNAMSIZ` less its terminating zero).
const MAX_INTERFACE_NAME: usize = 15;

impl Rail {
    /// Reads `ADDR/PREFIX` as a subnet, anything else as an interface name.
    ///
    /// # Errors
    /// A subnet whose address or prefix does not parse, or an interface name that
    /// no interface can have.
    pub fn parse(text: &str) -> Result<Rail, TransportError> {
        let bad = |reason: String| TransportError::Rail { rail: text.to_owned(), reason };
        if let Some((addr, prefix)) = text.split_once('/') {
            let net: IpAddr = addr.parse().map_err(|_| bad(format!("{addr:?} is not an IP address")))?;
            let most = if net.is_ipv4() { 32 } else { 128 };
            let prefix = prefix.parse::<u8>().ok().filter(|p| *p <= most).ok_or_else(|| {
                bad(format!("the prefix length {prefix:?} is not a number from 0 to {most}"))
            })?;
            return Ok(Rail::Subnet { net, prefix });
        }
        if let Ok(addr) = text.parse::<IpAddr>() {
            let whole = if addr.is_ipv4() { 24 } else { 64 };
            return Err(bad(format!(
                "an address, not a subnet: give its prefix length too (as {addr}/{whole}), or an interface name"
            )));
        }
        let valid = |c: char| c.is_ascii_graphic() && c != '/' && c != ',';
        if text.is_empty() || text.len() > MAX_INTERFACE_NAME || !text.chars().all(valid) {
            return Err(bad(format!(
                "neither a subnet (ADDR/PREFIX, as 10.1.0.0/16) nor an interface name (1 to \
                 {MAX_INTERFACE_NAME} characters, as ib1)"
            )));
        }
        Ok(Rail::Interface(text.to_owned()))
    }

    /// Whether `addr` of interface `interface` lies on this rail.
    pub fn holds(&self, interface: &str, addr: IpAddr) -> bool {
        match self {
            Rail::Interface(name) => name == interface,
            Rail::Subnet { net, prefix } => same_prefix(*net, addr, *prefix),
        }
    }
}

/// Whether `a` and `b` share their first `prefix` bits (never across families).
fn same_prefix(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    let (a, b, bits) = match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            (u128::from(u32::from(a)) << 96, u128::from(u32::from(b)) << 96, 32)
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let prefix = u32::from(prefix).min(bits);
    let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix) };
    a & mask == b & mask
}

/// Checks a list of rails as a plan carries it: at most [`treecast_wire::MAX_RAILS`],
/// each a subnet or an interface name ([`Rail::parse`]).
///
/// # Errors
/// Too many rails, or the first that does not parse.
pub fn check_rails(rails: &[String]) -> Result<(), TransportError> {
    if rails.len() > treecast_wire::MAX_RAILS {
        return Err(TransportError::Rail {
            rail: rails.join(","),
            reason: format!("{} rails are more than {}", rails.len(), treecast_wire::MAX_RAILS),
        });
    }
    rails.iter().try_for_each(|r| Rail::parse(r).map(drop))
}

/// This host's address on each of `rails`, in order: on an interface, its first
/// IPv4 address, else its first IPv6 one that is not link-local.
///
/// # Errors
/// A rail that does not parse, one on which this host has no address (naming the
/// addresses it has), or a failure to list them.
pub fn rail_addresses(rails: &[String]) -> Result<Vec<IpAddr>, TransportError> {
    let have = interface_addresses()
        .map_err(|source| TransportError::Io { what: "listing this host's addresses".into(), source })?;
    rails.iter().map(|text| address_on(&Rail::parse(text)?, text, &have)).collect()
}

/// The address of `have` (interface, address) that lies on `rail`.
fn address_on(rail: &Rail, text: &str, have: &[(String, IpAddr)]) -> Result<IpAddr, TransportError> {
    let on: Vec<IpAddr> = have.iter().filter(|(i, a)| rail.holds(i, *a)).map(|(_, a)| *a).collect();
    let usable = |a: &&IpAddr| match a {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
    };
    on.iter().find(|a| a.is_ipv4()).or_else(|| on.iter().find(usable)).copied().ok_or_else(|| {
        let list: Vec<String> = have.iter().map(|(i, a)| format!("{a} ({i})")).collect();
        TransportError::Rail {
            rail: text.to_owned(),
            reason: format!(
                "this host has no address on it (it has {}); give every host an address on each \
                 rail, or name the rails in TREECAST_RAILS by subnet or interface as the hosts have them",
                if list.is_empty() { "none".to_owned() } else { list.join(", ") }
            ),
        }
    })
}

/// Every address of every interface that is up, with the interface's name.
fn interface_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    let mut found = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    #[allow(unsafe_code)]
    // SAFETY: getifaddrs fills `list` with a linked list it allocated, or fails and
    // leaves it alone; every node is read only before freeifaddrs frees them all, and
    // each `ifa_addr` is read as the socket address its family says it is.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut at = list;
        while let Some(ifa) = at.as_ref() {
            at = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_flags & (libc::IFF_UP as libc::c_uint) == 0 {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
            let addr = match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::from(sin6.sin6_addr.s6_addr)
                }
                _ => continue,
            };
            found.push((name, addr));
        }
        libc::freeifaddrs(list);
    }
    Ok(found)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn have() -> Vec<(String, IpAddr)> {
        [("lo", "127.0.0.1"), ("eth0", "10.203.16.3"), ("eth1", "fe80::1"), ("eth1", "10.203.116.3")]
            .iter()
            .map(|(i, a)| ((*i).to_owned(), a.parse().unwrap()))
            .collect()
    }

    #[test]
    fn subnets_and_interfaces_find_this_host_s_address_on_each_rail() {
        let on = |text: &str| address_on(&Rail::parse(text).unwrap(), text, &have()).map(|a| a.to_string());
        assert_eq!(on("10.203.16.0/24").unwrap(), "10.203.16.3");
        assert_eq!(on("10.203.116.0/24").unwrap(), "10.203.116.3");
        assert_eq!(on("10.0.0.0/8").unwrap(), "10.203.16.3", "the first of several");
        assert_eq!(on("eth1").unwrap(), "10.203.116.3", "IPv4 before IPv6");
        assert_eq!(on("0.0.0.0/0").unwrap(), "127.0.0.1");
        let missing = on("10.9.0.0/16").unwrap_err().to_string();
        assert!(missing.contains("no address on it") && missing.contains("10.203.16.3 (eth0)"), "{missing}");
        assert!(on("ib1").is_err());
    }

    #[test]
    fn a_link_local_address_is_not_a_rail_s_address() {
        let have = vec![
            ("ib0".to_owned(), "fe80::2".parse().unwrap()),
            ("ib0".to_owned(), "fd00::2".parse().unwrap()),
        ];
        assert_eq!(address_on(&Rail::Interface("ib0".into()), "ib0", &have).unwrap().to_string(), "fd00::2");
        assert!(address_on(&Rail::Interface("ib0".into()), "ib0", &have[..1]).is_err());
    }

    #[test]
    fn malformed_rails_say_what_a_rail_is() {
        for bad in [
            "10.1.0.0/33",
            "10.1.0/16",
            "fd00::/129",
            "",
            "a-name-longer-than-15",
            "x/y",
            "eth 0",
            "10.1.0.1",
            "fd00::1",
        ] {
            let e = Rail::parse(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert_eq!(Rail::parse("ib1").unwrap(), Rail::Interface("ib1".into()));
        assert!(matches!(Rail::parse("fd00::/8").unwrap(), Rail::Subnet { prefix: 8, .. }));
    }

    #[test]
    fn this_host_s_loopback_is_on_its_rail() {
        let found = rail_addresses(&["127.0.0.0/8".to_owned(), "lo".to_owned()]).unwrap();
        assert_eq!(found, vec![IpAddr::from([127, 0, 0, 1]); 2]);
    }
}
