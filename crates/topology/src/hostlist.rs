//! Host lists as cluster users type them, in the conventions of Slurm, pdsh and
//! ClusterShell: `node[01-16,20],login1`, `n[1-9/2] -n5`, `^hosts.txt`, `bob@gpu[1-4]`.
//!
//! * [`HostList::new`] reads one or more expressions, applies exclusions and drops
//!   repeated hosts, returning [`HostListWarning`]s for the caller to show (this crate
//!   prints nothing).
//! * [`expand`] is the same for one expression, without the warnings.
//! * [`compress`] writes a list of host names back as a short expression, for display.
//! * [`split_user`] and [`bare_host`] take `user@host` apart: the user is only for ssh,
//!   the host is what names the machine.
//!
//! # Syntax
//!
//! An expression is a list of **items** separated by commas or white space (or both);
//! white space inside brackets is ignored. An item is one of:
//!
//! * a **pattern**: literal host-name text (letters, digits, `.`, `-`, `_`, and one `@`
//!   after a user name) with zero or more **bracket groups** anywhere in it. A group is
//!   a comma-separated list of numbers `N`, ranges `N-M` (`N <= M`) and stepped ranges
//!   `N-M/S` (every S-th number from N, as ClusterShell writes them).
//! * `^FILE`: the hosts of a file, one pattern (or several) per line; `#` starts a
//!   comment, blank lines are skipped (pdsh's convention). A file cannot name other
//!   files or exclusions.
//! * `-ITEM`: excludes the hosts of a pattern or a `^FILE` from the whole list, wherever
//!   it stands (pdsh's convention). Excluding a host that is not in the list is no error.
//!
//! Examples:
//!
//! * `node[01-03,07]` is `node01 node02 node03 node07`.
//! * `rack[1-2]-n[01-02]` is the cartesian product, the first group varying slowest:
//!   `rack1-n01 rack1-n02 rack2-n01 rack2-n02`.
//! * `n[1-9/4]` is `n1 n5 n9`; `n[1-4],-n2` and `n[1-4] -n2` are `n1 n3 n4`.
//! * `bob@n[1-2]` is `bob@n1 bob@n2`: ssh logs in to them as `bob`.
//! * `n1.cluster.org` is one host; dots are kept.
//! * Zero padding comes from the lower bound: when it has a leading zero, every number
//!   of the entry is padded to its width (`[08-11]` is `08 09 10 11`); otherwise numbers
//!   are not padded (`[8-11]` is `8 9 10 11`).
//!
//! A host name starts with a letter or a digit (a user name may also start with `_`),
//! so nothing from a host list can be taken for an option by ssh or srun. A host named
//! twice (with or without a user) is kept once, where it first appears, and reported in
//! a warning. A list names at most [`MAX_HOSTS`] hosts, exclusions included (checked
//! before anything is expanded). Errors name the 1-based column, counted in characters,
//! of what is wrong, and for a host file its path and line.
//!
//! Reading `^FILE` is the only I/O here; files are read whole, up to
//! [`MAX_HOST_FILE_BYTES`].
//!
//! ```
//! use treecast_topology::hostlist::{compress, expand, HostList};
//!
//! let hosts = expand("n[01-03,07], login")?;
//! assert_eq!(hosts, ["n01", "n02", "n03", "n07", "login"]);
//! assert_eq!(compress(&hosts), "n[01-03,07],login");
//!
//! let list = HostList::new(&["n[1-9/2] n3", "-n5"], &["n9"])?;
//! assert_eq!(list.hosts, ["n1", "n3", "n7"]);
//! assert_eq!(list.warnings.len(), 1); // n3 was named twice
//! # Ok::<(), treecast_topology::TopologyError>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::io::Read;

pub use crate::hostname::{bare_host, split_user};
use crate::hostname::{check_name, host_char_ok};
use crate::TopologyError;

/// The largest number of hosts a list names, exclusions included.
pub const MAX_HOSTS: usize = 1_000_000;

/// The largest `^FILE` read, in bytes: a million hosts of a dozen characters, with room.
pub const MAX_HOST_FILE_BYTES: u64 = 64 << 20;

fn bad(expr: &str, column: usize, reason: impl Into<String>) -> TopologyError {
    TopologyError::BadHostList { expr: expr.to_string(), column, reason: reason.into() }
}

/// Something in a host list that did not stop it but that the user should hear about.
#[non_exhaustive]
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum HostListWarning {
    /// Hosts named more than once; each is kept once, where it first appears.
    #[error(
        "{hosts} listed more than once; each host is kept once, where it first appears ({})",
        repeats(.dropped)
    )]
    Duplicates {
        /// The repeated hosts, folded as by [`compress`].
        hosts: String,
        /// How many repeats were dropped.
        dropped: usize,
    },
}

/// `1 repeat dropped`, `2 repeats dropped`.
fn repeats(n: &usize) -> String {
    format!("{n} repeat{} dropped", if *n == 1 { "" } else { "s" })
}

/// The hosts of one or more host-list expressions, exclusions applied, each host once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostList {
    /// The hosts in order, as written (`user@host` where a user was given).
    pub hosts: Vec<String>,
    /// What the caller should tell the user; none of it stopped the list.
    pub warnings: Vec<HostListWarning>,
}

impl HostList {
    /// Reads the expressions of `include` (their union, in order) minus every host of
    /// `exclude` and of their own `-ITEM`s; see the [module documentation](self).
    ///
    /// Hosts are compared without their `user@`: `bob@n1` and `n1` are the same host,
    /// and `-n1` excludes both. A host named twice is kept where it first appears, with
    /// a [`HostListWarning::Duplicates`]. The result may be empty (everything excluded).
    ///
    /// # Errors
    ///
    /// [`TopologyError::BadHostList`], naming the expression and column, for an empty
    /// expression or item (`a,,b`), unbalanced or nested brackets, an empty group
    /// (`[]`), a non-numeric or reversed range (`[a-3]`, `[5-3]`), a bad step (`[1-9/0]`,
    /// `[5/2]`), a character that cannot be in a host name, a host that does not start
    /// with a letter or a digit (`--x`, `.x`), an `@` without a user or host, `-` inside
    /// `exclude`, or more than [`MAX_HOSTS`] hosts; [`TopologyError::ReadHostFile`] for a
    /// `^FILE` that cannot be read, and [`TopologyError::HostFile`] wrapping the error
    /// found on one of its lines.
    pub fn new(include: &[&str], exclude: &[&str]) -> Result<HostList, TopologyError> {
        let mut sink = Sink::default();
        for expr in include {
            read_expr(expr, Mode::List, false, &mut sink)?;
        }
        for expr in exclude {
            read_expr(expr, Mode::Exclude, true, &mut sink)?;
        }
        let excluded: HashSet<&str> = sink.exclude.iter().map(|h| bare_host(h)).collect();
        let mut seen: HashSet<&str> = HashSet::with_capacity(sink.include.len());
        let mut hosts = Vec::with_capacity(sink.include.len());
        let mut repeats: Vec<String> = Vec::new();
        let mut repeated: HashSet<&str> = HashSet::new();
        let mut dropped = 0;
        for name in &sink.include {
            let host = bare_host(name);
            if excluded.contains(host) {
                continue;
            }
            if seen.insert(host) {
                hosts.push(name.clone());
            } else {
                dropped += 1;
                if repeated.insert(host) {
                    repeats.push(host.to_string());
                }
            }
        }
        let mut warnings = Vec::new();
        if dropped > 0 {
            warnings.push(HostListWarning::Duplicates { hosts: compress(&repeats), dropped });
        }
        Ok(HostList { hosts, warnings })
    }

    /// [`HostList::new`] for one expression and no exclusion list.
    ///
    /// # Errors
    ///
    /// Those of [`HostList::new`].
    pub fn parse(expr: &str) -> Result<HostList, TopologyError> {
        HostList::new(&[expr], &[])
    }
}

/// Expands a host-list expression into host names, in order, each host once (a
/// repeated host is dropped silently: use [`HostList`] to hear about it); see the
/// [module documentation](self) for the syntax.
///
/// # Errors
///
/// Those of [`HostList::new`].
pub fn expand(expr: &str) -> Result<Vec<String>, TopologyError> {
    Ok(HostList::parse(expr)?.hosts)
}

/// One entry of a bracket group: `lo..=hi` every `step`, padded with zeros to `width`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    lo: u64,
    hi: u64,
    step: u64,
    width: usize,
}

impl Entry {
    /// The number of values.
    fn len(&self) -> u64 {
        ((self.hi - self.lo) / self.step).saturating_add(1)
    }

    /// The values, in order.
    fn values(&self) -> impl Iterator<Item = u64> {
        (self.lo..=self.hi).step_by(usize::try_from(self.step).unwrap_or(usize::MAX))
    }
}

/// A piece of a pattern: literal text or a bracket group.
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
            format!("non-numeric range `{entry}`: a number is missing; write `N`, `N-M` or `N-M/STEP`"),
        ));
    }
    if let Some(k) = (start..end).find(|&k| !chars[k].is_ascii_digit()) {
        return Err(bad(
            expr,
            k + 1,
            format!(
                "non-numeric range `{entry}`: `{}` is not a digit; write `N`, `N-M` or `N-M/STEP`",
                chars[k]
            ),
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
        let slash = (s..e).find(|&i| chars[i] == '/');
        let body_end = slash.unwrap_or(e);
        let dash = (s..body_end).find(|&i| chars[i] == '-');
        let lo_end = dash.unwrap_or(body_end);
        let lo = number(expr, chars, s, lo_end, &entry)?;
        let hi = match dash {
            Some(d) => number(expr, chars, d + 1, body_end, &entry)?,
            None => lo,
        };
        if lo > hi {
            return Err(bad(
                expr,
                s + 1,
                format!("reversed range `{entry}`: the lower bound comes first (`{hi}-{lo}`)"),
            ));
        }
        let step = match slash {
            None => 1,
            Some(at) if dash.is_none() => {
                return Err(bad(
                    expr,
                    at + 1,
                    format!("step without a range in `{entry}`: a step goes after a range, `N-M/STEP`"),
                ));
            }
            Some(at) => match number(expr, chars, at + 1, e, &entry)? {
                0 => return Err(bad(expr, at + 2, format!("step 0 in `{entry}`: a step is at least 1"))),
                step => step,
            },
        };
        let width = if lo_end - s > 1 && chars[s] == '0' { lo_end - s } else { 0 };
        entries.push(Entry { lo, hi, step, width });
        from = k + 1;
    }
    Ok(entries)
}

/// Parses the pattern `chars[start..end]` (already trimmed, not empty).
fn pattern(expr: &str, chars: &[char], start: usize, end: usize) -> Result<Vec<Part>, TopologyError> {
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
        } else if host_char_ok(c) || c == '@' {
            text.push(c);
            k += 1;
        } else {
            return Err(bad(
                expr,
                k + 1,
                format!(
                    "`{c}` cannot be part of a host name (letters, digits, `.`, `-`, `_`, and `@` after a user)"
                ),
            ));
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// The number of hosts a pattern expands to, saturating.
fn pattern_len(parts: &[Part]) -> u64 {
    parts
        .iter()
        .map(|p| match p {
            Part::Text(_) => 1,
            Part::Group(entries) => entries.iter().fold(0u64, |acc, e| acc.saturating_add(e.len())),
        })
        .fold(1u64, u64::saturating_mul)
}

/// The host names of a pattern, the first group varying slowest.
fn names_of(parts: &[Part]) -> Vec<String> {
    let mut names = vec![String::new()];
    for part in parts {
        match part {
            Part::Text(t) => names.iter_mut().for_each(|n| n.push_str(t)),
            Part::Group(entries) => {
                let mut next = Vec::new();
                for n in &names {
                    for e in entries {
                        for v in e.values() {
                            next.push(format!("{n}{v:0width$}", width = e.width));
                        }
                    }
                }
                names = next;
            }
        }
    }
    names
}

/// What an expression is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A host list: patterns, `^FILE` and `-ITEM`.
    List,
    /// An exclusion list (`--exclude`): patterns and `^FILE`, all excluded.
    Exclude,
    /// A line of a host file: patterns only.
    File,
}

/// The hosts read so far: to add, to remove, and how many in all.
#[derive(Default)]
struct Sink {
    include: Vec<String>,
    exclude: Vec<String>,
    total: u64,
}

/// Reads one expression into `sink`; `negate` sends its hosts to the exclusions.
fn read_expr(expr: &str, mode: Mode, negate: bool, sink: &mut Sink) -> Result<(), TopologyError> {
    let chars: Vec<char> = expr.chars().collect();
    if chars.iter().all(|c| c.is_whitespace()) {
        return Err(bad(expr, 1, "empty host list"));
    }
    // Split into comma-separated segments outside brackets, checking the brackets.
    let mut segments = Vec::new();
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
                segments.push((from, k));
                from = k + 1;
            }
            _ => {}
        }
    }
    if let Some(o) = open {
        return Err(bad(expr, o + 1, "unbalanced brackets: `[` is never closed"));
    }
    segments.push((from, chars.len()));

    for &(from, to) in &segments {
        let (s, e) = trim(&chars, from, to);
        if s == e {
            return Err(bad(expr, from + 1, "empty item: two commas in a row, or a comma at an end"));
        }
        // Items of the segment: separated by white space outside brackets.
        let mut k = s;
        while k < e {
            let start = k;
            let mut inside = false;
            while k < e && (inside || !chars[k].is_whitespace()) {
                match chars[k] {
                    '[' => inside = true,
                    ']' => inside = false,
                    _ => {}
                }
                k += 1;
            }
            read_item(expr, &chars, start, k, mode, negate, sink)?;
            while k < e && chars[k].is_whitespace() {
                k += 1;
            }
        }
    }
    Ok(())
}

/// Reads the item `chars[start..end]` (not empty, no white space outside brackets).
fn read_item(
    expr: &str,
    chars: &[char],
    start: usize,
    end: usize,
    mode: Mode,
    mut negate: bool,
    sink: &mut Sink,
) -> Result<(), TopologyError> {
    let mut s = start;
    if chars[s] == '-' {
        match mode {
            Mode::List => negate = true,
            Mode::Exclude => {
                return Err(bad(
                    expr,
                    s + 1,
                    "`-` in an exclusion list: list the hosts to exclude without `-`",
                ));
            }
            Mode::File => {
                return Err(bad(
                    expr,
                    s + 1,
                    "a host file lists hosts to add, and a host name cannot start with `-`; \
                     exclude hosts with `-HOST` in the list or with --exclude",
                ));
            }
        }
        s += 1;
        if s == end {
            return Err(bad(expr, s, "`-` needs a host after it: `-HOST` excludes HOST"));
        }
    }
    if chars[s] == '^' {
        if mode == Mode::File {
            return Err(bad(expr, s + 1, "`^FILE` cannot be used inside a host file"));
        }
        let path: String = chars[s + 1..end].iter().collect();
        if path.is_empty() {
            return Err(bad(expr, s + 1, "`^` needs a file name after it: `^FILE`"));
        }
        return read_file(&path, negate, sink);
    }
    let parts = pattern(expr, chars, s, end)?;
    sink.total = sink.total.saturating_add(pattern_len(&parts));
    if sink.total > MAX_HOSTS as u64 {
        return Err(bad(
            expr,
            s + 1,
            format!("more than {MAX_HOSTS} hosts; host lists are limited to {MAX_HOSTS} hosts"),
        ));
    }
    let names = names_of(&parts);
    for name in &names {
        if let Err((_, fault)) = check_name(name) {
            return Err(bad(expr, s + 1, format!("`{name}`: {}", fault.reason())));
        }
    }
    if negate {
        sink.exclude.extend(names);
    } else {
        sink.include.extend(names);
    }
    Ok(())
}

/// Reads the hosts of a `^FILE`: one or more patterns per line, `#` comments.
fn read_file(path: &str, negate: bool, sink: &mut Sink) -> Result<(), TopologyError> {
    let fail = |reason: String| TopologyError::ReadHostFile { path: path.to_string(), reason };
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_HOST_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > MAX_HOST_FILE_BYTES {
        return Err(fail(format!("it is larger than {} MiB", MAX_HOST_FILE_BYTES >> 20)));
    }
    let text = String::from_utf8(bytes).map_err(|e| fail(format!("it is not UTF-8 text: {e}")))?;
    for (k, line) in text.lines().enumerate() {
        let content = line.split('#').next().unwrap_or_default();
        if content.trim().is_empty() {
            continue;
        }
        read_expr(content, Mode::File, negate, sink).map_err(|e| TopologyError::HostFile {
            path: path.to_string(),
            line: k + 1,
            source: Box::new(e),
        })?;
    }
    Ok(())
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
        let (col, reason) = err("good,b/d");
        assert_eq!(col, 7);
        assert!(reason.contains("`/`"), "{reason}");
        assert_eq!(err("n/1").0, 2);
        assert_eq!(err("a^b").0, 2);
        // Columns count characters, not bytes.
        assert_eq!(err("é").0, 1);
        assert_eq!(err("a,bé").0, 4);
    }

    #[test]
    fn white_space_separates_items() {
        assert_eq!(ok("a b"), ["a", "b"]);
        assert_eq!(ok("n[1-2] login\tx\n y"), ["n1", "n2", "login", "x", "y"]);
        assert_eq!(ok("a , b,c d"), ["a", "b", "c", "d"]);
        // Inside brackets it is still ignored.
        assert_eq!(ok("n[1, 3 ] m"), ["n1", "n3", "m"]);
        assert_eq!(err("n[1 - 2]").0, 4);
    }

    #[test]
    fn duplicates_are_dropped_where_they_repeat_with_a_warning() {
        let list = HostList::parse("n[1-3],x,n2").unwrap();
        assert_eq!(list.hosts, ["n1", "n2", "n3", "x"]);
        assert_eq!(list.warnings, [HostListWarning::Duplicates { hosts: "n2".into(), dropped: 1 }]);
        let text = list.warnings[0].to_string();
        assert!(text.starts_with("n2 listed more than once"), "{text}");
        let list = HostList::parse("n[1,1] n[1-4] n[3-4]").unwrap();
        assert_eq!(list.hosts, ["n1", "n2", "n3", "n4"]);
        assert_eq!(list.warnings, [HostListWarning::Duplicates { hosts: "n[1,3-4]".into(), dropped: 4 }]);
        // Padding makes different hosts; a user does not.
        assert_eq!(ok("n[01,1]"), ["n01", "n1"]);
        let list = HostList::parse("bob@n1,n1,alice@n1").unwrap();
        assert_eq!(list.hosts, ["bob@n1"]);
        assert_eq!(list.warnings.len(), 1);
        assert!(HostList::parse("n[1-3]").unwrap().warnings.is_empty());
    }

    #[test]
    fn steps_as_clustershell_writes_them() {
        assert_eq!(ok("n[1-9/2]"), ["n1", "n3", "n5", "n7", "n9"]);
        assert_eq!(ok("n[1-10/3]"), ["n1", "n4", "n7", "n10"]);
        assert_eq!(ok("n[01-10/3]"), ["n01", "n04", "n07", "n10"]);
        assert_eq!(ok("n[1-3/5]"), ["n1"]);
        assert_eq!(ok("n[1-9/02]"), ["n1", "n3", "n5", "n7", "n9"]);
        assert_eq!(ok("n[1-9/2,4]"), ["n1", "n3", "n5", "n7", "n9", "n4"]);
        assert_eq!(ok("n[1-4/2]x[1-2]"), ["n1x1", "n1x2", "n3x1", "n3x2"]);
        let (col, reason) = err("n[1-9/0]");
        assert_eq!(col, 7);
        assert!(reason.contains("step 0"), "{reason}");
        let (col, reason) = err("n[5/2]");
        assert_eq!(col, 4);
        assert!(reason.contains("step without a range"), "{reason}");
        assert_eq!(err("n[1-9/]").0, 7);
        assert_eq!(err("n[1-9/x]").0, 7);
        assert_eq!(err("n[1-9/-2]").0, 7);
        assert_eq!(err("n[1-9/2/3]").0, 8);
        // The limit counts the stepped hosts, not the span.
        assert_eq!(ok("n[1-2000000/2]").len(), MAX_HOSTS);
    }

    #[test]
    fn exclusions_apply_to_the_whole_list() {
        assert_eq!(ok("n[1-4],-n2"), ["n1", "n3", "n4"]);
        assert_eq!(ok("-n2 n[1-4]"), ["n1", "n3", "n4"]);
        assert_eq!(ok("n[1-6] -n[2-3] -n[5-9]"), ["n1", "n4"]);
        assert_eq!(ok("n[1-2],-x"), ["n1", "n2"]);
        assert_eq!(ok("bob@n[1-3],-n2"), ["bob@n1", "bob@n3"]);
        assert_eq!(ok("n[1-3],-bob@n3"), ["n1", "n2"]);
        assert!(ok("n1,-n1").is_empty());
        let list = HostList::new(&["n[1-5]", "m1 -n1"], &["n[4-9]", "m1"]).unwrap();
        assert_eq!(list.hosts, ["n2", "n3"]);
        // An excluded host that was repeated is no warning.
        assert!(HostList::parse("n1,n1,-n1").unwrap().warnings.is_empty());
        let (col, reason) = err("n1,-");
        assert_eq!(col, 4);
        assert!(reason.contains("`-` needs a host"), "{reason}");
        match HostList::new(&["n1"], &["-n1"]) {
            Err(TopologyError::BadHostList { column: 1, reason, .. }) => {
                assert!(reason.contains("exclusion list"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn names_start_with_a_letter_or_a_digit() {
        for (expr, col) in [("--oProxyCommand", 2), ("a,--Fevil", 4), (".n1", 1), ("_n1", 1), ("bob@-x", 1)] {
            let (c, reason) = err(expr);
            assert_eq!(c, col, "{expr}: {reason}");
            assert!(reason.contains("starts with a letter or a digit"), "{expr}: {reason}");
        }
        assert_eq!(ok("[1-2]n"), ["1n", "2n"]);
        assert_eq!(ok("_bob@n1"), ["_bob@n1"]);
    }

    #[test]
    fn users_for_ssh() {
        assert_eq!(ok("bob@n[1-2],n3"), ["bob@n1", "bob@n2", "n3"]);
        // One host, whatever the user: the first is kept.
        let list = HostList::parse("u[1-2]@n").unwrap();
        assert_eq!(list.hosts, ["u1@n"]);
        assert_eq!(list.warnings, [HostListWarning::Duplicates { hosts: "n".into(), dropped: 1 }]);
        assert_eq!(split_user("bob@n1"), (Some("bob"), "n1"));
        assert_eq!(split_user("n1"), (None, "n1"));
        assert_eq!(bare_host("bob@n1.x.org"), "n1.x.org");
        let (col, reason) = err("a,@group");
        assert_eq!(col, 3);
        assert!(reason.contains("nothing before `@`"), "{reason}");
        assert!(err("bob@").1.contains("no host name after `@`"));
        assert!(err("a@b@c").1.contains("`@`"));
    }

    #[test]
    fn host_files_as_pdsh_reads_them() {
        let dir = tempdir();
        let file = dir.join("hosts");
        std::fs::write(&file, "# the rack\nn[1-3]   # three\n\n  login1 login2\n\tn2\n").unwrap();
        let path = file.display().to_string();
        let list = HostList::parse(&format!("x,^{path}")).unwrap();
        assert_eq!(list.hosts, ["x", "n1", "n2", "n3", "login1", "login2"]);
        assert_eq!(list.warnings.len(), 1);
        assert_eq!(ok(&format!("n[0-5],-^{path}")), ["n0", "n4", "n5"]);
        let list = HostList::new(&["n[0-5]"], &[&format!("^{path}")]).unwrap();
        assert_eq!(list.hosts, ["n0", "n4", "n5"]);

        std::fs::write(&file, "n1\n\nn[2-\n").unwrap();
        let e = expand(&format!("^{path}")).unwrap_err();
        match &e {
            TopologyError::HostFile { path: p, line: 3, source } => {
                assert_eq!(p, &path);
                assert!(matches!(**source, TopologyError::BadHostList { column: 2, .. }), "{source:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            e.to_string().starts_with(&format!("host file {path}, line 3: host list `n[2-`, column 2:")),
            "{e}"
        );

        std::fs::write(&file, "n1\n-Fevil.conf\n").unwrap();
        let e = expand(&format!("^{path}")).unwrap_err();
        assert!(matches!(e, TopologyError::HostFile { line: 2, .. }), "{e:?}");
        assert!(e.to_string().contains("cannot start with `-`"), "{e}");
        std::fs::write(&file, "^other\n").unwrap();
        let e = expand(&format!("^{path}")).unwrap_err();
        assert!(e.to_string().contains("inside a host file"), "{e}");

        let missing = dir.join("missing").display().to_string();
        let e = expand(&format!("n1,^{missing}")).unwrap_err();
        assert!(matches!(&e, TopologyError::ReadHostFile { path, .. } if *path == missing), "{e:?}");
        assert!(e.to_string().starts_with(&format!("cannot read host file {missing}: ")), "{e}");
        assert_eq!(err("n1,^").0, 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A fresh directory for one test.
    fn tempdir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("treecast-hostlist-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
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
        fn expand_never_panics(expr in "[a-c0-9,\\[\\]\\- ./@]{0,40}") {
            let _ = expand(&expr);
        }

        #[test]
        fn steps_agree_with_a_loop(lo in 0u64..300, span in 0u64..300, step in 1u64..40, pad in 0usize..4) {
            let hi = lo + span;
            let want: Vec<String> = if pad > 0 {
                let width = pad + 1;
                let mut v = Vec::new();
                let mut k = lo;
                while k <= hi {
                    v.push(format!("n{k:0width$}"));
                    k += step;
                }
                v
            } else {
                let mut v = Vec::new();
                let mut k = lo;
                while k <= hi {
                    v.push(format!("n{k}"));
                    k += step;
                }
                v
            };
            let expr = if pad > 0 {
                format!("n[{lo:0w$}-{hi}/{step}]", w = pad + 1)
            } else {
                format!("n[{lo}-{hi}/{step}]")
            };
            prop_assert_eq!(expand(&expr).unwrap(), want);
        }

        #[test]
        fn exclusion_is_a_set_difference(
            a in proptest::collection::vec(host(), 1..40),
            b in proptest::collection::vec(host(), 1..40),
            inline in any::<bool>(),
        ) {
            let a = unique(a);
            let b = unique(b);
            let list = if inline {
                let minus: Vec<String> = b.iter().map(|h| format!("-{h}")).collect();
                HostList::parse(&format!("{} {}", a.join(","), minus.join(" "))).unwrap()
            } else {
                HostList::new(&[&a.join(" ")], &[&compress(&b)]).unwrap()
            };
            let want: Vec<String> = a.iter().filter(|h| !b.contains(h)).cloned().collect();
            prop_assert_eq!(list.hosts, want);
            prop_assert!(list.warnings.is_empty());
        }

        #[test]
        fn repeats_are_dropped_keeping_the_first(hosts in proptest::collection::vec(host(), 1..60)) {
            let list = HostList::parse(&hosts.join(",")).unwrap();
            let want = unique(hosts.clone());
            prop_assert_eq!(list.warnings.is_empty(), want.len() == hosts.len());
            prop_assert_eq!(list.hosts, want);
        }

        #[test]
        fn round_trip_with_users(hosts in proptest::collection::vec(host(), 1..40), user in "[a-z_][a-z0-9]{0,3}") {
            let mut hosts: Vec<String> = unique(hosts).into_iter().map(|h| format!("{user}@{h}")).collect();
            hosts.sort();
            let mut back = expand(&compress(&hosts)).unwrap();
            back.sort();
            prop_assert_eq!(back, hosts);
        }
    }
}
