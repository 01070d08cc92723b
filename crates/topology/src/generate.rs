//! Generated trees: [`Shape`], [`Topology::generate`], [`Topology::from_spec`] and the
//! host-based [`Topology::from_hosts`].

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::hostname::{bare_host, check_name};
use crate::{Topology, TopologyError, MAX_NODES};

/// The host name generators use when none is given.
pub const DEFAULT_HOST: &str = "localhost";

/// The shape of a generated tree; see [`Topology::generate`].
///
/// Parsed from specs: `flat`, `kary:K`, `knomial:K`, `balanced:AxBxC` (also written
/// `AxBxC`, and MRNet's `1xAxB` where the leading `1` is the front-end) and `fanout:F`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Shape {
    /// The front-end with every back-end as a direct child.
    Flat,
    /// The shallowest tree in which no node has more than K children, as balanced as
    /// possible.
    Kary(usize),
    /// A k-nomial tree (binomial for K = 2).
    Knomial(usize),
    /// A fixed fan-out per level: the root has `A` children, each of them `B`, and so on.
    Balanced(Vec<usize>),
    /// "N back-ends with fan-out at most F": the same tree as [`Shape::Kary`].
    Fanout(usize),
}

impl fmt::Display for Shape {
    /// Writes the spec form that [`Shape::from_str`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Flat => f.write_str("flat"),
            Shape::Kary(k) => write!(f, "kary:{k}"),
            Shape::Knomial(k) => write!(f, "knomial:{k}"),
            Shape::Fanout(k) => write!(f, "fanout:{k}"),
            Shape::Balanced(levels) => {
                f.write_str("balanced:")?;
                for (i, l) in levels.iter().enumerate() {
                    if i > 0 {
                        f.write_str("x")?;
                    }
                    write!(f, "{l}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for Shape {
    type Err = TopologyError;

    /// Reads a generator spec: `flat`, `kary:K`, `knomial:K`, `balanced:AxB...` (or bare
    /// `AxB...`, with MRNet's optional leading `1x`), `fanout:F`. The kind is
    /// case-insensitive; surrounding blanks are ignored. Values are checked by
    /// [`Topology::generate`], not here (so `kary:1` parses).
    ///
    /// # Errors
    ///
    /// [`TopologyError::BadSpec`] for an unknown kind, a missing or non-numeric
    /// parameter, or a `flat` with a parameter.
    fn from_str(spec: &str) -> Result<Shape, TopologyError> {
        let s = spec.trim();
        let bad = |reason: &str| TopologyError::BadSpec { spec: s.to_string(), reason: reason.to_string() };
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k.trim().to_ascii_lowercase(), Some(a.trim())),
            None => (s.to_ascii_lowercase(), None),
        };
        let number = |a: Option<&str>| -> Result<usize, TopologyError> {
            let a = a
                .filter(|a| !a.is_empty())
                .ok_or_else(|| bad(&format!("`{kind}` needs a number after `:`")))?;
            if !a.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("`{a}` is not a non-negative integer")));
            }
            a.parse().map_err(|_| bad(&format!("`{a}` is too large")))
        };
        match kind.as_str() {
            "flat" if arg.is_none() => Ok(Shape::Flat),
            "flat" => Err(bad("`flat` takes no parameter; give the back-end count separately")),
            "kary" => Ok(Shape::Kary(number(arg)?)),
            "knomial" => Ok(Shape::Knomial(number(arg)?)),
            "fanout" => Ok(Shape::Fanout(number(arg)?)),
            "balanced" => match arg {
                Some(a) => Ok(Shape::Balanced(levels(a).map_err(|r| bad(&r))?)),
                None => Err(bad("`balanced` needs fan-outs per level, like `balanced:4x4`")),
            },
            _ if arg.is_none()
                && kind.contains('x')
                && kind.bytes().all(|b| b.is_ascii_digit() || b == b'x') =>
            {
                Ok(Shape::Balanced(levels(&kind).map_err(|r| bad(&r))?))
            }
            "" => Err(bad("the spec is empty")),
            _ => Err(bad(&match nearest_kind(&kind) {
                Some(near) => format!("unknown kind `{kind}`; did you mean `{near}`?"),
                None => format!("unknown kind `{kind}`"),
            })),
        }
    }
}

/// The generator kind `kind` is a typo of (one or two letters off), if any.
fn nearest_kind(kind: &str) -> Option<&'static str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let here = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(here + 1);
                prev = here;
            }
        }
        row[b.len()]
    }
    ["flat", "kary", "knomial", "balanced", "fanout"].into_iter().find(|k| distance(kind, k) <= 2)
}

/// True for text written like a generator spec, `word:N` or `word:AxB`, with a word
/// of letters: with no such file, the spec's own error says more than "cannot read".
fn written_like_a_spec(spec: &str) -> bool {
    spec.trim().split_once(':').is_some_and(|(kind, arg)| {
        !kind.is_empty()
            && kind.bytes().all(|b| b.is_ascii_alphabetic())
            && !arg.is_empty()
            && arg.bytes().all(|b| b.is_ascii_digit() || b == b'x' || b == b'X')
    })
}

/// Reads `AxBxC` into fan-outs, dropping MRNet's leading `1` (the front-end).
fn levels(text: &str) -> Result<Vec<usize>, String> {
    if text.trim().is_empty() {
        return Err("no fan-outs given; write fan-outs per level like `4x4x4`".to_owned());
    }
    let mut out = Vec::new();
    for part in text.split(['x', 'X']) {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!(
                "`{text}` has a level with no fan-out (an `x` at an end, or two together); write fan-outs per level like `4x4x4`"
            ));
        }
        if !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("`{part}` is not a fan-out; write fan-outs per level like `4x4x4`"));
        }
        out.push(part.parse::<usize>().map_err(|_| format!("fan-out `{part}` is too large"))?);
    }
    if out.len() > 1 && out[0] == 1 {
        out.remove(0);
    }
    Ok(out)
}

/// Checks a host name (`host` or `user@host`) for generated trees.
fn check_host(host: &str) -> Result<(), TopologyError> {
    check_name(host)
        .map_err(|(_, fault)| TopologyError::BadHostName { host: host.to_string(), reason: fault.reason() })
}

/// A tree under construction: child lists in any numbering, node 0 the root.
struct Builder {
    children: Vec<Vec<usize>>,
}

impl Builder {
    fn new() -> Builder {
        Builder { children: vec![Vec::new()] }
    }

    fn add(&mut self, parent: usize) -> usize {
        let id = self.children.len();
        self.children.push(Vec::new());
        self.children[parent].push(id);
        id
    }

    fn finish(self, host: &str) -> Topology {
        Topology::from_children(0, &self.children, |_, id| (host.to_string(), id as u32))
    }
}

/// Splits `n` into `parts` shares that differ by at most one, larger ones first.
fn shares(n: usize, parts: usize) -> impl Iterator<Item = usize> {
    let (q, r) = (n / parts, n % parts);
    (0..parts).map(move |i| q + usize::from(i < r))
}

/// Nodes in a k-ary sub-tree holding `n` leaves (a single leaf when `n == 1`).
fn kary_count(k: usize, n: usize, memo: &mut HashMap<usize, usize>) -> usize {
    if n <= 1 {
        return 1;
    }
    if let Some(&c) = memo.get(&n) {
        return c;
    }
    let c = 1 + shares(n, k.min(n)).map(|s| kary_count(k, s, memo)).sum::<usize>();
    memo.insert(n, c);
    c
}

fn kary(k: usize, n: usize, what: &str, host: &str) -> Result<Topology, TopologyError> {
    // The root always gets min(k, n) children, even for n == 1.
    let mut memo = HashMap::new();
    let total = 1 + shares(n, k.min(n)).map(|s| kary_count(k, s, &mut memo)).sum::<usize>();
    if total > MAX_NODES {
        return Err(TopologyError::TooLarge { what: what.to_string(), limit: MAX_NODES });
    }
    let mut b = Builder::new();
    // Work list of (node, leaves to hold); a node with one leaf to hold is that leaf.
    let mut work = vec![(0usize, n)];
    while let Some((node, leaves)) = work.pop() {
        let kids = k.min(leaves);
        for share in shares(leaves, kids) {
            let child = b.add(node);
            if share > 1 {
                work.push((child, share));
            }
        }
    }
    Ok(b.finish(host))
}

fn knomial(k: usize, n: usize, what: &str, host: &str) -> Result<Topology, TopologyError> {
    let mut b = Builder::new();
    let mut leaves = 0usize;
    // `pow`: the largest power of k not above the next node number.
    let mut pow = 1usize;
    while leaves < n {
        let r = b.children.len();
        if r >= MAX_NODES {
            return Err(TopologyError::TooLarge { what: what.to_string(), limit: MAX_NODES });
        }
        if let Some(next) = pow.checked_mul(k) {
            if next <= r {
                pow = next;
            }
        }
        // Clearing the most significant base-k digit of r is r mod k^m, k^m <= r < k^(m+1).
        let parent = r % pow;
        if parent != 0 && b.children[parent].is_empty() {
            leaves -= 1;
        }
        b.add(parent);
        leaves += 1;
    }
    Ok(b.finish(host))
}

fn balanced(levels: &[usize], host: &str, what: &str) -> Result<Topology, TopologyError> {
    let too_large = || TopologyError::TooLarge { what: what.to_string(), limit: MAX_NODES };
    let mut total = 1usize;
    let mut width = 1usize;
    for &f in levels {
        width = width.checked_mul(f).ok_or_else(too_large)?;
        total = total.checked_add(width).ok_or_else(too_large)?;
        if total > MAX_NODES {
            return Err(too_large());
        }
    }
    let mut b = Builder::new();
    let mut level = vec![0usize];
    for &f in levels {
        let mut next = Vec::with_capacity(level.len() * f);
        for &node in &level {
            for _ in 0..f {
                next.push(b.add(node));
            }
        }
        level = next;
    }
    Ok(b.finish(host))
}

impl Topology {
    /// Generates a tree of the given shape with `backends` leaves, every node on `host`
    /// with its pre-order id as index.
    ///
    /// * [`Shape::Flat`]: the root with N back-end children.
    /// * [`Shape::Kary`] / [`Shape::Fanout`]: the shallowest tree with N leaves in which
    ///   no node has more than K children. Each interior node uses as many children as
    ///   allowed (`min(K, leaves below it)`) and spreads its leaves over them as evenly
    ///   as possible, larger shares first; a share of one leaf is that leaf. With N <= K
    ///   the tree is flat.
    /// * [`Shape::Knomial`]: nodes 0, 1, 2, ... where node r's parent is r with its most
    ///   significant base-K digit cleared, added until there are N leaves.
    /// * [`Shape::Balanced`]: the fan-out of each level; the back-ends are the product.
    ///   `backends` may be `None`; if given it must equal the product.
    ///
    /// # Errors
    ///
    /// [`TopologyError::MissingBackendCount`] when a shape other than `balanced` gets no
    /// count, [`TopologyError::NoBackends`] for a count of 0,
    /// [`TopologyError::FanoutTooSmall`] for K < 2, [`TopologyError::BadSpec`] for a
    /// balanced shape with no level or a zero fan-out,
    /// [`TopologyError::BackendMismatch`] when a balanced shape has a different number of
    /// back-ends, [`TopologyError::TooLarge`] above [`MAX_NODES`] nodes, and
    /// [`TopologyError::BadHostName`] for a host name the text format cannot hold.
    pub fn generate(shape: &Shape, backends: Option<usize>, host: &str) -> Result<Topology, TopologyError> {
        check_host(host)?;
        if backends == Some(0) {
            return Err(TopologyError::NoBackends);
        }
        let spec = shape.to_string();
        let need = || backends.ok_or_else(|| TopologyError::MissingBackendCount { spec: spec.clone() });
        let fanout = |k: usize| {
            if k < 2 {
                Err(TopologyError::FanoutTooSmall { spec: spec.clone() })
            } else {
                Ok(k)
            }
        };
        match shape {
            Shape::Flat => {
                let n = need()?;
                if n >= MAX_NODES {
                    return Err(TopologyError::TooLarge {
                        what: format!("{spec} with {n} back-ends"),
                        limit: MAX_NODES,
                    });
                }
                let mut b = Builder::new();
                for _ in 0..n {
                    b.add(0);
                }
                Ok(b.finish(host))
            }
            Shape::Kary(k) | Shape::Fanout(k) => {
                let k = fanout(*k)?;
                let n = need()?;
                let what = format!("{spec} with {n} back-ends");
                if n >= MAX_NODES {
                    return Err(TopologyError::TooLarge { what, limit: MAX_NODES });
                }
                kary(k, n, &what, host)
            }
            Shape::Knomial(k) => {
                let k = fanout(*k)?;
                let n = need()?;
                let what = format!("{spec} with {n} back-ends");
                if n >= MAX_NODES {
                    return Err(TopologyError::TooLarge { what, limit: MAX_NODES });
                }
                knomial(k, n, &what, host)
            }
            Shape::Balanced(levels) => {
                if levels.is_empty() {
                    return Err(TopologyError::BadSpec {
                        spec,
                        reason: "`balanced` needs at least one level, like `balanced:4x4`".to_string(),
                    });
                }
                if levels.contains(&0) {
                    return Err(TopologyError::BadSpec {
                        spec,
                        reason: "every level needs a fan-out of at least 1".to_string(),
                    });
                }
                let has = levels.iter().try_fold(1usize, |acc, &f| acc.checked_mul(f));
                let Some(has) = has.filter(|&h| h < MAX_NODES) else {
                    return Err(TopologyError::TooLarge { what: spec, limit: MAX_NODES });
                };
                if let Some(asked) = backends {
                    if asked != has {
                        return Err(TopologyError::BackendMismatch { what: spec, has, asked });
                    }
                }
                balanced(levels, host, &spec)
            }
        }
    }

    /// Builds a tree from a command-line spec: a generator spec (see [`Shape`]) on
    /// [`DEFAULT_HOST`], or else the path of a topology file.
    ///
    /// # Errors
    ///
    /// The errors of [`Topology::generate`] for a generator spec; for a file,
    /// [`TopologyError::ReadFile`] if it cannot be read (the message lists the accepted
    /// specs), [`TopologyError::File`] wrapping the parse error, and
    /// [`TopologyError::BackendMismatch`] if `backends` is given and differs from the
    /// file's number of leaves. A string that starts like a generator spec (`kary:x`)
    /// but is no valid spec and no existing file reports the spec error.
    pub fn from_spec(spec: &str, backends: Option<usize>) -> Result<Topology, TopologyError> {
        let shape_err = match spec.parse::<Shape>() {
            Ok(shape) => return Topology::generate(&shape, backends, DEFAULT_HOST),
            Err(e) => e,
        };
        let path = std::path::Path::new(spec);
        let text = match read_topology_file(path) {
            Ok(text) => text,
            Err(ReadError::TooLarge) => {
                let reason = format!(
                    "it is larger than {} MiB, the limit of topology files",
                    MAX_TOPOLOGY_FILE_BYTES >> 20
                );
                return Err(TopologyError::ReadFile { path: spec.to_string(), reason });
            }
            Err(ReadError::Io(e)) => {
                let lower = spec.trim().to_ascii_lowercase();
                let looks_like_spec = ["flat", "kary", "knomial", "balanced", "fanout"]
                    .iter()
                    .any(|k| lower == *k || lower.starts_with(&format!("{k}:")));
                if (looks_like_spec || written_like_a_spec(spec)) && !path.exists() {
                    return Err(shape_err);
                }
                return Err(TopologyError::ReadFile { path: spec.to_string(), reason: e.to_string() });
            }
        };
        let topo = Topology::parse(&text)
            .map_err(|e| TopologyError::File { path: spec.to_string(), source: Box::new(e) })?;
        if let Some(asked) = backends {
            if asked != topo.backends() {
                return Err(TopologyError::BackendMismatch {
                    what: format!("topology file {spec}"),
                    has: topo.backends(),
                    asked,
                });
            }
        }
        Ok(topo)
    }

    /// Builds a tree over real hosts: the front-end `front_end_host:0` at the root,
    /// `backends_per_host` back-ends on each host as leaves, and comm nodes on the hosts
    /// themselves.
    ///
    /// * **Shape**: exactly the tree of [`Shape::Kary`] (`kary:F`, `fanout:F`) with
    ///   `hosts.len() * backends_per_host` back-ends: no node has more than `fanout`
    ///   children and the depth is the smallest possible (`F^depth >= N`). When all the
    ///   back-ends fit under the root, they are its direct children and there is no comm
    ///   node.
    /// * **Ranks** follow the host order: the back-ends of `hosts[0]` get ranks
    ///   `0 .. backends_per_host`, then those of `hosts[1]`, and so on.
    /// * **Placement**: a back-end runs on its host. A comm node serves a contiguous range
    ///   of ranks and runs on the host of the first of them, so it is always on a host of
    ///   its own sub-tree.
    /// * **Indexes** are unique per host: a host's back-ends take `0 .. backends_per_host`
    ///   in rank order, then its comm nodes take the next indexes in pre-order
    ///   (back-ends `h1:0 .. h1:k-1`, comm node `h1:k`). When `front_end_host` is also in
    ///   `hosts`, the front-end keeps index 0 there and everything else on that host
    ///   moves up by one.
    ///
    /// Host names are kept whole, dots included, and so is a `user@` before them (for
    /// ssh); hosts are compared without it, so `bob@n1` and `n1` are the same host.
    ///
    /// # Errors
    ///
    /// [`TopologyError::NoHosts`] for an empty list, [`TopologyError::FanoutTooSmall`]
    /// for `fanout < 2`, [`TopologyError::NoBackends`] for `backends_per_host == 0`,
    /// [`TopologyError::BadHostName`] for a host name the text format cannot hold,
    /// [`TopologyError::RepeatedHost`] for a host listed twice, and
    /// [`TopologyError::TooLarge`] above [`MAX_NODES`] nodes.
    pub fn from_hosts(
        hosts: &[String],
        fanout: usize,
        backends_per_host: usize,
        front_end_host: &str,
    ) -> Result<Topology, TopologyError> {
        check_host(front_end_host)?;
        if hosts.is_empty() {
            return Err(TopologyError::NoHosts);
        }
        if fanout < 2 {
            return Err(TopologyError::FanoutTooSmall { spec: format!("fanout:{fanout}") });
        }
        if backends_per_host == 0 {
            return Err(TopologyError::NoBackends);
        }
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(hosts.len());
        for (k, host) in hosts.iter().enumerate() {
            check_host(host)?;
            if let Some(&first) = seen.get(bare_host(host)) {
                return Err(TopologyError::RepeatedHost {
                    host: host.clone(),
                    first: first + 1,
                    second: k + 1,
                });
            }
            seen.insert(bare_host(host), k);
        }
        let what =
            format!("fanout:{fanout} over {} hosts with {backends_per_host} back-ends each", hosts.len());
        let Some(n) = hosts.len().checked_mul(backends_per_host).filter(|&n| n < MAX_NODES) else {
            return Err(TopologyError::TooLarge { what, limit: MAX_NODES });
        };
        let shape = kary(fanout, n, &what, front_end_host)?;

        // Below MAX_NODES, so indexes fit in u32.
        let per_host = backends_per_host as u32;
        let base = |host: &str| u32::from(bare_host(host) == bare_host(front_end_host));
        let mut next_comm: HashMap<&str, u32> = HashMap::new();
        let mut nodes = shape.nodes().to_vec();
        for (id, node) in nodes.iter_mut().enumerate() {
            if id == 0 {
                node.host = front_end_host.to_string();
                node.index = 0;
                continue;
            }
            let (host, index) = match shape.backend_rank(id) {
                Some(rank) => {
                    let host = hosts[rank as usize / backends_per_host].as_str();
                    (host, base(host) + rank % per_host)
                }
                None => {
                    let host = hosts[shape.first_rank(id) as usize / backends_per_host].as_str();
                    let next = next_comm.entry(host).or_insert_with(|| base(host) + per_host);
                    *next += 1;
                    (host, *next - 1)
                }
            };
            node.host = host.to_string();
            node.index = index;
        }
        Ok(Topology::from_preorder(nodes))
    }

    /// [`Topology::from_hosts`] over a host-list expression such as `node[01-16],login1`
    /// (see [`hostlist`](crate::hostlist)). Repeated hosts are dropped silently; build
    /// the list with [`HostList`](crate::hostlist::HostList) to tell the user about them.
    ///
    /// # Errors
    ///
    /// The errors of [`HostList::new`](crate::hostlist::HostList::new), then those of
    /// [`Topology::from_hosts`].
    pub fn from_hosts_spec(
        hosts_expr: &str,
        fanout: usize,
        backends_per_host: usize,
        front_end_host: &str,
    ) -> Result<Topology, TopologyError> {
        let hosts = crate::hostlist::expand(hosts_expr)?;
        Topology::from_hosts(&hosts, fanout, backends_per_host, front_end_host)
    }
}

/// The largest topology file read, in bytes, as for host files: a million nodes of a
/// few dozen characters, with room.
pub const MAX_TOPOLOGY_FILE_BYTES: u64 = 64 << 20;

/// Why a topology file was not read.
enum ReadError {
    /// Over [`MAX_TOPOLOGY_FILE_BYTES`].
    TooLarge,
    /// Could not be opened or read, or is not UTF-8.
    Io(std::io::Error),
}

/// The file's text, reading at most one byte past the limit (`/dev/zero` never ends).
fn read_topology_file(path: &std::path::Path) -> Result<String, ReadError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    let mut bytes = Vec::new();
    file.take(MAX_TOPOLOGY_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(ReadError::Io)?;
    if bytes.len() as u64 > MAX_TOPOLOGY_FILE_BYTES {
        return Err(ReadError::TooLarge);
    }
    String::from_utf8(bytes)
        .map_err(|e| ReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_in_a_spec_is_a_spec_error_not_a_missing_file() {
        // Regression: `karry:4` was reported as "cannot read topology file".
        let e = Topology::from_spec("karry:4", Some(16)).unwrap_err();
        assert!(matches!(e, TopologyError::BadSpec { .. }), "{e:?}");
        assert!(e.to_string().contains("did you mean `kary`?"), "{e}");
        let e = Topology::from_spec("/nonexistent/karry:4", Some(16)).unwrap_err();
        assert!(matches!(e, TopologyError::ReadFile { .. }), "a path stays a path: {e:?}");
    }

    #[test]
    fn a_topology_file_is_read_up_to_64_mib() {
        // Regression: `treecast topo /dev/zero` read gigabytes.
        let e = Topology::from_spec("/dev/zero", None).unwrap_err();
        assert!(e.to_string().contains("larger than 64 MiB, the limit of topology files"), "{e}");
    }

    #[test]
    fn shares_are_even_larger_first() {
        assert_eq!(shares(10, 4).collect::<Vec<_>>(), vec![3, 3, 2, 2]);
        assert_eq!(shares(3, 3).collect::<Vec<_>>(), vec![1, 1, 1]);
    }

    #[test]
    fn kary_count_matches_build() {
        for k in 2..6 {
            for n in 1..300 {
                let t = kary(k, n, "x", "h").unwrap();
                let mut memo = HashMap::new();
                let total = 1 + shares(n, k.min(n)).map(|s| kary_count(k, s, &mut memo)).sum::<usize>();
                assert_eq!(t.len(), total, "k={k} n={n}");
            }
        }
    }

    #[test]
    fn levels_drop_leading_one() {
        assert_eq!(levels("1x4x4").unwrap(), vec![4, 4]);
        assert_eq!(levels("1").unwrap(), vec![1]);
        assert!(levels("4xx4").is_err());
    }

    #[test]
    fn knomial_parent_rule() {
        // Binomial with 8 nodes: 0 -> 1 2 4, 1 -> 3 5, 2 -> 6, 3 -> 7.
        let mut b = Builder::new();
        let mut pow = 1;
        for r in 1..8usize {
            if pow * 2 <= r {
                pow *= 2;
            }
            b.add(r % pow);
        }
        assert_eq!(b.children[0], vec![1, 2, 4]);
        assert_eq!(b.children[1], vec![3, 5]);
        assert_eq!(b.children[2], vec![6]);
        assert_eq!(b.children[3], vec![7]);
    }
}
