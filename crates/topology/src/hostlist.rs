//! Host lists as cluster users type them (Slurm / pdsh style): `node[01-16,20],login1`.
//!
//! * [`expand`] turns an expression into the list of host names, in order.
//! * [`compress`] writes a list of host names back as a short expression, for display.
//!
//! # Syntax
//!
//! An expression is a comma-separated list of **items**; whitespace around items (and
//! around the entries inside brackets) is ignored. An item is literal host-name text
//! (letters, digits, `.`, `-`, `_`) with zero or more **bracket groups** anywhere in
//! it. A group is a comma-separated list of numbers `N` and ranges `N-M` (`N <= M`).
//!
//! * `node[01-03,07]` is `node01 node02 node03 node07`.
//! * `rack[1-2]-n[01-02]` is the cartesian product, the first group varying slowest:
//!   `rack1-n01 rack1-n02 rack2-n01 rack2-n02`.
//! * `n1.cluster.org` is one host; dots are kept.
//! * Zero padding comes from the lower bound: when it has a leading zero, every number
//!   of the entry is padded to its width (`[08-11]` is `08 09 10 11`); otherwise numbers
//!   are not padded (`[8-11]` is `8 9 10 11`).
//!
//! A host may appear only once in a list, and a list holds at most [`MAX_HOSTS`] hosts
//! (checked before anything is expanded). Errors name the 1-based column, counted in
//! characters, of what is wrong.
//!
//! ```
//! use treecast_topology::hostlist::{compress, expand};
//!
//! let hosts = expand("n[01-03,07], login")?;
//! assert_eq!(hosts, ["n01", "n02", "n03", "n07", "login"]);
//! assert_eq!(compress(&hosts), "n[01-03,07],login");
//! # Ok::<(), treecast_topology::TopologyError>(())
//! ```

use std::collections::HashMap;

use crate::parse::host_char_ok;
use crate::TopologyError;

/// The largest number of hosts [`expand`] produces.
pub const MAX_HOSTS: usize = 1_000_000;

fn bad(expr: &str, column: usize, reason: impl Into<String>) -> TopologyError {
    TopologyError::BadHostList { expr: expr.to_string(), column, reason: reason.into() }
}

/// One entry of a bracket group: `lo..=hi`, numbers padded with zeros to `width`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    lo: u64,
    hi: u64,
    width: usize,
}

/// A piece of an item: literal text or a bracket group.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Group(Vec<Entry>),
}

/// The 0-based char range `[start, end)` of `chars` with whitespace trimmed at both ends.
fn trim(chars: &[char], mut start: usize, mut end: usize) -> (usize, usize) {
    while start < end && chars[start].is_whitespace() {
        start += 1;
    }
    while end > start && chars[end - 1].is_whitespace() {
        end -= 1;
    }
    (start, end)
}

/// Reads the number `chars[start..end]` of the range entry `entry`.
fn number(expr: &str, chars: &[char], start: usize, end: usize, entry: &str) -> Result<u64, TopologyError> {
    if start == end {
        return Err(bad(
            expr,
            start + 1,
            format!("non-numeric range `{entry}`: a number is missing; write `N` or `N-M`"),
        ));
    }
    if let Some(k) = (start..end).find(|&k| !chars[k].is_ascii_digit()) {
        return Err(bad(
            expr,
            k + 1,
            format!("non-numeric range `{entry}`: `{}` is not a digit; write `N` or `N-M`", chars[k]),
        ));
    }
    let text: String = chars[start..end].iter().collect();
    text.parse::<u64>().map_err(|_| bad(expr, start + 1, format!("number `{text}` is too large")))
}

/// Parses the bracket group whose contents are `chars[start..end]` (`[` is at `start - 1`).
fn group(expr: &str, chars: &[char], start: usize, end: usize) -> Result<Vec<Entry>, TopologyError> {
    let (s, e) = trim(chars, start, end);
    if s == e {
        return Err(bad(expr, start, "empty range `[]`: write numbers or ranges like `[1-4,7]`"));
    }
    let mut entries = Vec::new();
    let mut from = start;
    for k in start..=end {
        if k < end && chars[k] != ',' {
            continue;
        }
        let (s, e) = trim(chars, from, k);
        if s == e {
            return Err(bad(expr, from + 1, "empty range between commas in `[...]`"));
        }
        let entry: String = chars[s..e].iter().collect();
        let dash = (s..e).find(|&i| chars[i] == '-');
        let lo_end = dash.unwrap_or(e);
        let lo = number(expr, chars, s, lo_end, &entry)?;
        let hi = match dash {
            Some(d) => number(expr, chars, d + 1, e, &entry)?,
            None => lo,
        };
        if lo > hi {
            return Err(bad(
                expr,
                s + 1,
                format!("reversed range `{entry}`: the lower bound comes first (`{hi}-{lo}`)"),
            ));
        }
        let width = if lo_end - s > 1 && chars[s] == '0' { lo_end - s } else { 0 };
        entries.push(Entry { lo, hi, width });
        from = k + 1;
    }
    Ok(entries)
}

/// Parses the item `chars[start..end]` (already trimmed, not empty).
fn item(expr: &str, chars: &[char], start: usize, end: usize) -> Result<Vec<Part>, TopologyError> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut k = start;
    while k < end {
        let c = chars[k];
        if c == '[' {
            // Brackets were checked to balance, within the item.
            let close = (k + 1..end).find(|&i| chars[i] == ']').unwrap_or(end);
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(Part::Group(group(expr, chars, k + 1, close)?));
            k = close + 1;
        } else if host_char_ok(c) {
            text.push(c);
            k += 1;
        } else {
            return Err(bad(
                expr,
                k + 1,
                format!("`{c}` cannot be part of a host name (letters, digits, `.`, `-` and `_`)"),
            ));
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// The number of hosts an item expands to, saturating.
fn item_len(parts: &[Part]) -> u64 {
    parts
        .iter()
        .map(|p| match p {
            Part::Text(_) => 1,
            Part::Group(entries) => {
                entries.iter().fold(0u64, |acc, e| acc.saturating_add((e.hi - e.lo).saturating_add(1)))
            }
        })
        .fold(1u64, u64::saturating_mul)
}

/// Expands a host-list expression into host names, in order; see the
/// [module documentation](self) for the syntax.
///
/// # Errors
///
/// [`TopologyError::BadHostList`], naming the column, for an empty expression or item
/// (`a,,b`), unbalanced or nested brackets, an empty group (`[]`), a non-numeric or
/// reversed range (`[a-3]`, `[5-3]`), a character that cannot be in a host name, or
/// more than [`MAX_HOSTS`] hosts; [`TopologyError::DuplicateHost`] for a host that
/// appears twice.
pub fn expand(expr: &str) -> Result<Vec<String>, TopologyError> {
    let chars: Vec<char> = expr.chars().collect();
    if chars.iter().all(|c| c.is_whitespace()) {
        return Err(bad(expr, 1, "empty host list"));
    }
    // Split into items at commas outside brackets, checking the brackets.
    let mut items = Vec::new();
    let mut from = 0;
    let mut open: Option<usize> = None;
    for (k, &c) in chars.iter().enumerate() {
        match c {
            '[' => {
                if let Some(o) = open {
                    return Err(bad(
                        expr,
                        k + 1,
                        format!("unbalanced brackets: `[` inside the group opened at column {}", o + 1),
                    ));
                }
                open = Some(k);
            }
            ']' if open.is_none() => {
                return Err(bad(expr, k + 1, "unbalanced brackets: `]` without a matching `[`"));
            }
            ']' => open = None,
            ',' if open.is_none() => {
                items.push((from, k));
                from = k + 1;
            }
            _ => {}
        }
    }
    if let Some(o) = open {
        return Err(bad(expr, o + 1, "unbalanced brackets: `[` is never closed"));
    }
    items.push((from, chars.len()));

    let mut parsed = Vec::with_capacity(items.len());
    let mut total = 0u64;
    for &(from, to) in &items {
        let (s, e) = trim(&chars, from, to);
        if s == e {
            return Err(bad(expr, from + 1, "empty item: two commas in a row, or a comma at an end"));
        }
        let parts = item(expr, &chars, s, e)?;
        total = total.saturating_add(item_len(&parts));
        if total > MAX_HOSTS as u64 {
            return Err(bad(
                expr,
                s + 1,
                format!("more than {MAX_HOSTS} hosts; host lists are limited to {MAX_HOSTS} hosts"),
            ));
        }
        parsed.push((s + 1, parts));
    }

    let mut hosts = Vec::with_capacity(total as usize);
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(total as usize);
    for (column, parts) in parsed {
        let mut names = vec![String::new()];
        for part in &parts {
            match part {
                Part::Text(t) => names.iter_mut().for_each(|n| n.push_str(t)),
                Part::Group(entries) => {
                    let mut next = Vec::new();
                    for n in &names {
                        for e in entries {
                            for v in e.lo..=e.hi {
                                next.push(format!("{n}{v:0width$}", width = e.width));
                            }
                        }
                    }
                    names = next;
                }
            }
        }
        for name in names {
            if let Some(&first_column) = seen.get(&name) {
                return Err(TopologyError::DuplicateHost {
                    expr: expr.to_string(),
                    column,
                    first_column,
                    host: name,
                });
            }
            seen.insert(name.clone(), column);
            hosts.push(name);
        }
    }
    Ok(hosts)
}

/// Splits a host at its last run of digits: `(prefix, digits, suffix, value)`. `None`
/// when there are no digits or the number does not fit in 64 bits.
fn split_number(host: &str) -> Option<(&str, &str, &str, u64)> {
    let bytes = host.as_bytes();
    let end = bytes.iter().rposition(u8::is_ascii_digit)? + 1;
    let start = bytes[..end].iter().rposition(|b| !b.is_ascii_digit()).map_or(0, |p| p + 1);
    // ASCII digits are whole characters, so these are char boundaries.
    let digits = &host[start..end];
    let value = digits.parse().ok()?;
    Some((&host[..start], digits, &host[end..], value))
}

/// The padding width an entry starting with `digits` gets from [`expand`].
fn width_of(digits: &str) -> usize {
    if digits.len() > 1 && digits.starts_with('0') {
        digits.len()
    } else {
        0
    }
}

/// Writes the numbers of one group (in their order) as bracket entries.
fn entries(nums: &[(&str, u64)]) -> String {
    let mut out = String::new();
    let mut k = 0;
    while k < nums.len() {
        let (first, lo) = nums[k];
        let width = width_of(first);
        let mut hi = lo;
        let mut j = k + 1;
        while j < nums.len() {
            let (digits, v) = nums[j];
            if hi.checked_add(1) != Some(v) || format!("{v:0width$}") != digits {
                break;
            }
            hi = v;
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(first);
        if hi != lo {
            out.push_str(&format!("-{hi:0width$}"));
        }
        k = j;
    }
    out
}

/// Writes hosts as a short host-list expression, for display: the inverse of [`expand`].
///
/// Hosts are grouped by what surrounds their last run of digits (`n` and `.x.org` in
/// `n07.x.org`); groups are written in the order of their first host, as
/// `prefix[entries]suffix` (or the host itself when the group has one host), joined by
/// `,`. Inside a group the numbers keep their order; consecutive increasing numbers with
/// the same zero padding become one range: `["n01", "n02", "n03", "n07", "login"]` gives
/// `n[01-03,07],login`. Hosts without digits are written as they are.
///
/// `expand(&compress(h))` gives back the same hosts as `h` (as a set, always), and in the
/// same order when the hosts of each group are contiguous in `h` — for example when `h`
/// is sorted, or is itself the output of [`expand`] on a list whose items have a single
/// bracket group at the last number. `h` is expected to hold unique, valid host names;
/// other strings are written as they are and may not expand.
pub fn compress(hosts: &[String]) -> String {
    /// A group: a host without digits, or hosts that differ only in their last number.
    enum Group<'a> {
        Plain(&'a str),
        Numbered { prefix: &'a str, suffix: &'a str, nums: Vec<(&'a str, u64)> },
    }
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    for host in hosts {
        match split_number(host) {
            None => groups.push(Group::Plain(host)),
            Some((prefix, digits, suffix, value)) => {
                let g = *index.entry((prefix, suffix)).or_insert_with(|| {
                    groups.push(Group::Numbered { prefix, suffix, nums: Vec::new() });
                    groups.len() - 1
                });
                if let Group::Numbered { nums, .. } = &mut groups[g] {
                    nums.push((digits, value));
                }
            }
        }
    }
    let mut out = String::new();
    for g in &groups {
        if !out.is_empty() {
            out.push(',');
        }
        match g {
            Group::Plain(h) => out.push_str(h),
            Group::Numbered { prefix, suffix, nums } if nums.len() == 1 => {
                out.push_str(prefix);
                out.push_str(nums[0].0);
                out.push_str(suffix);
            }
            Group::Numbered { prefix, suffix, nums } => {
                out.push_str(prefix);
                out.push('[');
                out.push_str(&entries(nums));
                out.push(']');
                out.push_str(suffix);
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(expr: &str) -> Vec<String> {
        expand(expr).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The column and reason of a syntax error.
    fn err(expr: &str) -> (usize, String) {
        match expand(expr) {
            Ok(h) => panic!("expanded `{expr}` to {h:?}"),
            Err(TopologyError::BadHostList { column, reason, .. }) => (column, reason),
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plain_hosts() {
        assert_eq!(ok("login1"), ["login1"]);
        assert_eq!(ok("a,b , c"), ["a", "b", "c"]);
        assert_eq!(ok("n1.cluster.org,n2.cluster.org"), ["n1.cluster.org", "n2.cluster.org"]);
        assert_eq!(ok("  n-1_x  "), ["n-1_x"]);
    }

    #[test]
    fn ranges_and_lists() {
        assert_eq!(ok("h[1-4],login1"), ["h1", "h2", "h3", "h4", "login1"]);
        assert_eq!(ok("node[01-03,20]"), ["node01", "node02", "node03", "node20"]);
    }

    #[test]
    fn padding_comes_from_the_lower_bound() {
        assert_eq!(ok("node[08-11]"), ["node08", "node09", "node10", "node11"]);
        assert_eq!(ok("node[8-11]"), ["node8", "node9", "node10", "node11"]);
        assert_eq!(ok("n[0-2]"), ["n0", "n1", "n2"]);
        assert_eq!(ok("n[007,8]"), ["n007", "n8"]);
        assert_eq!(ok("n[098-100]"), ["n098", "n099", "n100"]);
        assert_eq!(ok("n[00]"), ["n00"]);
    }

    #[test]
    fn cartesian_product_in_order() {
        assert_eq!(
            ok("rack[1-2]-n[01-03]"),
            ["rack1-n01", "rack1-n02", "rack1-n03", "rack2-n01", "rack2-n02", "rack2-n03"]
        );
        assert_eq!(ok("[1-2]x[3,5].org"), ["1x3.org", "1x5.org", "2x3.org", "2x5.org"]);
    }

    #[test]
    fn dots_suffixes_and_whitespace() {
        assert_eq!(ok("n[1-2].cluster.org"), ["n1.cluster.org", "n2.cluster.org"]);
        assert_eq!(ok(" n[1, 3 ] ,\tlogin "), ["n1", "n3", "login"]);
    }

    #[test]
    fn error_empty() {
        assert_eq!(err("").0, 1);
        assert_eq!(err("   ").0, 1);
        let (col, reason) = err("a,,b");
        assert_eq!(col, 3);
        assert!(reason.contains("empty item"), "{reason}");
        assert_eq!(err(",a").0, 1);
        assert_eq!(err("a,").0, 3);
        assert_eq!(err("a, ,b").0, 3);
    }

    #[test]
    fn error_unbalanced() {
        let (col, reason) = err("ab,n[1-3");
        assert_eq!(col, 5);
        assert!(reason.contains("never closed"), "{reason}");
        let (col, reason) = err("n1-3]");
        assert_eq!(col, 5);
        assert!(reason.contains("without a matching"), "{reason}");
        let (col, reason) = err("n[1[2]]");
        assert_eq!(col, 4);
        assert!(reason.contains("opened at column 2"), "{reason}");
    }

    #[test]
    fn error_empty_range() {
        let (col, reason) = err("x,n[]");
        assert_eq!(col, 4);
        assert!(reason.contains("empty range"), "{reason}");
        assert_eq!(err("n[ ]").0, 2);
        let (col, reason) = err("n[1,,3]");
        assert_eq!(col, 5);
        assert!(reason.contains("empty range"), "{reason}");
        assert_eq!(err("n[1,]").0, 5);
    }

    #[test]
    fn error_reversed_range() {
        let (col, reason) = err("node[1,5-3]");
        assert_eq!(col, 8);
        assert!(reason.contains("reversed range `5-3`"), "{reason}");
        assert!(reason.contains("`3-5`"), "{reason}");
    }

    #[test]
    fn error_non_numeric_range() {
        let (col, reason) = err("n[a-3]");
        assert_eq!(col, 3);
        assert!(reason.contains("non-numeric range `a-3`"), "{reason}");
        assert_eq!(err("n[1-x]").0, 5);
        assert_eq!(err("n[-3]").0, 3);
        assert_eq!(err("n[3-]").0, 5);
        assert_eq!(err("n[1-2-3]").0, 6);
        assert_eq!(err("n[1 - 2]").0, 4);
        let (col, reason) = err("n[99999999999999999999]");
        assert_eq!(col, 3);
        assert!(reason.contains("too large"), "{reason}");
    }

    #[test]
    fn error_bad_character() {
        let (col, reason) = err("good,ba d");
        assert_eq!(col, 8);
        assert!(reason.contains("` `"), "{reason}");
        assert_eq!(err("n/1").0, 2);
        // Columns count characters, not bytes.
        assert_eq!(err("é").0, 1);
        assert_eq!(err("a,bé").0, 4);
    }

    #[test]
    fn error_duplicate() {
        let e = expand("n[1-3],x,n2").unwrap_err();
        assert_eq!(
            e,
            TopologyError::DuplicateHost {
                expr: "n[1-3],x,n2".to_string(),
                column: 10,
                first_column: 1,
                host: "n2".to_string()
            }
        );
        assert!(e.to_string().contains("`n2` appears twice"), "{e}");
        assert!(matches!(expand("n[1,1]"), Err(TopologyError::DuplicateHost { column: 1, .. })));
        assert!(matches!(expand("n[01,1]"), Ok(h) if h == ["n01", "n1"]));
    }

    #[test]
    fn error_too_many_hosts() {
        assert_eq!(ok("n[1-1000000]").len(), MAX_HOSTS);
        let (col, reason) = err("a, n[1-1000000]");
        assert_eq!(col, 4);
        assert!(reason.contains("more than 1000000 hosts"), "{reason}");
        // Checked before expanding: a huge product fails fast.
        assert_eq!(err("a[1-100000]b[1-100000]c[1-100000]").0, 1);
        assert_eq!(err("n[0-18446744073709551615]").0, 1);
    }

    #[test]
    fn messages_name_expression_and_column() {
        let e = expand("n[5-3]").unwrap_err();
        assert_eq!(
            e.to_string(),
            "host list `n[5-3]`, column 3: reversed range `5-3`: the lower bound comes first (`3-5`)"
        );
    }

    #[test]
    fn compress_examples() {
        assert_eq!(compress(&strings(&["n01", "n02", "n03", "n07", "login"])), "n[01-03,07],login");
        assert_eq!(compress(&strings(&["n8", "n9", "n10", "n11"])), "n[8-11]");
        assert_eq!(compress(&strings(&["n08", "n09", "n10", "n11"])), "n[08-11]");
        assert_eq!(compress(&strings(&["n9", "n010"])), "n[9,010]");
        assert_eq!(compress(&strings(&["n5"])), "n5");
        assert_eq!(compress(&[]), "");
        assert_eq!(
            compress(&strings(&["n1.x.org", "n2.x.org", "login", "n3.y.org", "n3.x.org"])),
            "n[1-3].x.org,login,n3.y.org"
        );
        assert_eq!(compress(&strings(&["rack1-n01", "rack1-n02", "rack2-n01"])), "rack1-n[01-02],rack2-n01");
        assert_eq!(compress(&strings(&["n3", "n1", "n2"])), "n[3,1-2]");
        assert_eq!(compress(&strings(&["n99999999999999999999"])), "n99999999999999999999");
    }

    #[test]
    fn split_number_takes_the_last_run() {
        assert_eq!(split_number("rack1-n07.org"), Some(("rack1-n", "07", ".org", 7)));
        assert_eq!(split_number("42"), Some(("", "42", "", 42)));
        assert_eq!(split_number("login"), None);
    }

    /// Host names built from a few prefixes and suffixes, numbered with various paddings.
    fn host() -> impl Strategy<Value = String> {
        let prefix = prop::sample::select(vec!["n", "node", "rack1-n", "gpu-", "", "x.y"]);
        let suffix = prop::sample::select(vec!["", ".cluster.org", "-ib"]);
        let number = prop::option::of((0u64..130, prop::sample::select(vec![0usize, 2, 3])));
        (prefix, number, suffix).prop_map(|(p, n, s)| match n {
            Some((v, w)) => format!("{p}{v:0w$}{s}"),
            None if p.is_empty() => format!("login{s}"),
            None => format!("{p}{s}"),
        })
    }

    fn unique(hosts: Vec<String>) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        hosts.into_iter().filter(|h| seen.insert(h.clone())).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn round_trip_sorted(hosts in proptest::collection::vec(host(), 0..80)) {
            let mut hosts = unique(hosts);
            // Sorted by (prefix, suffix, number): every group is contiguous.
            hosts.sort_by_key(|h| match split_number(h) {
                Some((p, d, s, v)) => (p.to_string(), s.to_string(), v, d.to_string()),
                None => (h.clone(), String::new(), 0, String::new()),
            });
            let text = compress(&hosts);
            if hosts.is_empty() {
                prop_assert_eq!(text, "");
            } else {
                prop_assert_eq!(expand(&text).unwrap(), hosts);
            }
        }

        #[test]
        fn round_trip_any_order_as_a_set(hosts in proptest::collection::vec(host(), 1..80)) {
            let hosts = unique(hosts);
            let text = compress(&hosts);
            let mut back = expand(&text).unwrap();
            let mut want = hosts.clone();
            back.sort();
            want.sort();
            prop_assert_eq!(back, want);
        }

        #[test]
        fn compress_of_expand_is_stable(hosts in proptest::collection::vec(host(), 1..40)) {
            let hosts = unique(hosts);
            let once = compress(&hosts);
            prop_assert_eq!(compress(&expand(&once).unwrap()), once);
        }

        #[test]
        fn expand_never_panics(expr in "[a-c0-9,\\[\\]\\- .]{0,40}") {
            let _ = expand(&expr);
        }
    }
}
