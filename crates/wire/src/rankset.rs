//! Compact sets of back-end ranks, kept as sorted, merged, inclusive ranges.

use std::fmt;
use std::str::FromStr;

use crate::{codec::Reader, DecodeError};

/// A set of ranks such as `0-15,32`, stored as sorted disjoint inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RankSet {
    ranges: Vec<(u32, u32)>,
}

impl RankSet {
    /// The empty set.
    pub fn new() -> Self {
        RankSet::default()
    }

    /// All ranks in `first..first + count`, clamped at `u32::MAX`.
    pub fn range(first: u32, count: u32) -> Self {
        if count == 0 {
            return RankSet::new();
        }
        RankSet { ranges: vec![(first, first.saturating_add(count - 1))] }
    }

    /// The set holding only `rank`.
    pub fn single(rank: u32) -> Self {
        RankSet { ranges: vec![(rank, rank)] }
    }

    /// The inclusive ranges, sorted and disjoint.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    /// Number of ranks in the set.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| u64::from(b - a) + 1).sum()
    }

    /// True when the set holds no rank.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Smallest rank, if any.
    pub fn first(&self) -> Option<u32> {
        self.ranges.first().map(|r| r.0)
    }

    /// True when `rank` is in the set.
    pub fn contains(&self, rank: u32) -> bool {
        let idx = self.ranges.partition_point(|&(_, hi)| hi < rank);
        self.ranges.get(idx).is_some_and(|&(lo, _)| lo <= rank)
    }

    /// Adds one rank.
    pub fn insert(&mut self, rank: u32) {
        self.insert_range(rank, rank);
    }

    /// Adds the inclusive range `lo..=hi`.
    pub fn insert_range(&mut self, lo: u32, hi: u32) {
        let (lo, hi) = (lo.min(hi), lo.max(hi));
        let start = self.ranges.partition_point(|&(_, h)| h.saturating_add(1) < lo);
        let mut end = start;
        let (mut nlo, mut nhi) = (lo, hi);
        while end < self.ranges.len() && self.ranges[end].0 <= hi.saturating_add(1) {
            nlo = nlo.min(self.ranges[end].0);
            nhi = nhi.max(self.ranges[end].1);
            end += 1;
        }
        self.ranges.splice(start..end, [(nlo, nhi)]);
    }

    /// Adds every rank of `other`.
    pub fn union_with(&mut self, other: &RankSet) {
        // A few ranges go in one by one; more are merged in one pass over both
        // lists, not inserted one by one (each insert may shift the whole list).
        if other.ranges.len() <= 2 {
            for &(lo, hi) in &other.ranges {
                self.insert_range(lo, hi);
            }
            return;
        }
        let mut out: Vec<(u32, u32)> = Vec::with_capacity(self.ranges.len() + other.ranges.len());
        let (mut a, mut b) = (self.ranges.iter().peekable(), other.ranges.iter().peekable());
        // Ranges taken in order of their starts, from whichever list has the lower.
        while let Some(&next) = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if y.0 < x.0 => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        } {
            match out.last_mut() {
                // Overlapping or adjacent: one range.
                Some(last) if next.0 <= last.1.saturating_add(1) => last.1 = last.1.max(next.1),
                _ => out.push(next),
            }
        }
        self.ranges = out;
    }

    /// The ranks in both sets.
    pub fn intersection(&self, other: &RankSet) -> RankSet {
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a, b) = (self.ranges[i], other.ranges[j]);
            let lo = a.0.max(b.0);
            let hi = a.1.min(b.1);
            if lo <= hi {
                out.push((lo, hi));
            }
            if a.1 < b.1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        RankSet { ranges: out }
    }

    /// True when the sets share a rank.
    pub fn intersects(&self, other: &RankSet) -> bool {
        !self.intersection(other).is_empty()
    }

    /// The ranks of `self` that are not in `other`.
    pub fn difference(&self, other: &RankSet) -> RankSet {
        let mut out = Vec::new();
        // Both lists are sorted: ranges of `other` wholly below this range are below
        // every later one too, so each is passed over once (linear, not n × m).
        let mut first = 0;
        for &(lo, hi) in &self.ranges {
            while other.ranges.get(first).is_some_and(|&(_, ohi)| ohi < lo) {
                first += 1;
            }
            // `next` is the smallest rank of lo..=hi not yet excluded or emitted.
            let mut next = Some(lo);
            for &(olo, ohi) in &other.ranges[first..] {
                let Some(n) = next else { break };
                if ohi < n {
                    continue;
                }
                if olo > hi {
                    break;
                }
                if olo > n {
                    out.push((n, olo - 1));
                }
                next = ohi.checked_add(1).filter(|&m| m <= hi);
            }
            if let Some(n) = next {
                out.push((n, hi));
            }
        }
        RankSet { ranges: out }
    }

    /// Iterates over every rank in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|&(lo, hi)| lo..=hi)
    }

    /// Appends the encoding: `u32` count of ranges, then `lo`, `hi` pairs.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        for &(lo, hi) in &self.ranges {
            out.extend_from_slice(&lo.to_le_bytes());
            out.extend_from_slice(&hi.to_le_bytes());
        }
    }

    /// Reads the encoding written by [`RankSet::encode`].
    ///
    /// # Errors
    /// Truncation, or ranges that are not sorted, disjoint and non-adjacent.
    pub fn decode(r: &mut Reader<'_>) -> Result<RankSet, DecodeError> {
        let n = r.len_u32("rank set", r.remaining() / 8)?;
        let mut ranges: Vec<(u32, u32)> = Vec::with_capacity(n);
        for _ in 0..n {
            let lo = r.u32("rank set")?;
            let hi = r.u32("rank set")?;
            let ordered = lo <= hi;
            // `Option::is_none_or` would need Rust 1.82; the MSRV is 1.80.
            let after_prev = match ranges.last() {
                None => true,
                Some(&(_, phi)) => phi.checked_add(1).is_some_and(|next: u32| lo > next),
            };
            if !ordered || !after_prev {
                return Err(DecodeError::Invalid {
                    what: "rank set",
                    detail: format!(
                        "range {lo}-{hi} is not sorted, disjoint and separated from the previous one"
                    ),
                });
            }
            ranges.push((lo, hi));
        }
        Ok(RankSet { ranges })
    }
}

impl FromIterator<u32> for RankSet {
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        let mut set = RankSet::new();
        for r in iter {
            set.insert(r);
        }
        set
    }
}

impl fmt::Display for RankSet {
    /// Writes `0-15,32`; the empty set is written as nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for RankSet {
    type Err = DecodeError;

    /// Parses `0-15,32` (spaces allowed around items).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut set = RankSet::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || DecodeError::Invalid {
                what: "rank list",
                detail: format!("{item:?} is not a rank or a range like 4-7"),
            };
            let (lo, hi) = match item.split_once('-') {
                Some((a, b)) => (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?),
                None => {
                    let r = item.parse().map_err(|_| bad())?;
                    (r, r)
                }
            };
            if lo > hi {
                return Err(bad());
            }
            set.insert_range(lo, hi);
        }
        Ok(set)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn display_is_compact() {
        let s: RankSet = [0, 1, 2, 3, 32, 5, 4, 7].into_iter().collect();
        assert_eq!(s.to_string(), "0-5,7,32");
        assert_eq!("0-5, 7,32".parse::<RankSet>().unwrap(), s);
    }

    #[test]
    fn a_union_up_to_the_last_rank_merges_its_ranges() {
        let mut a: RankSet = [0, 5, u32::MAX - 1].into_iter().collect();
        let b: RankSet = [1, 7, 9, u32::MAX].into_iter().collect();
        a.union_with(&b);
        assert_eq!(a.ranges(), [(0, 1), (5, 5), (7, 7), (9, 9), (u32::MAX - 1, u32::MAX)]);
    }

    proptest! {
        #[test]
        fn behaves_like_a_set(a in proptest::collection::vec(0u32..200, 0..60), b in proptest::collection::vec(0u32..200, 0..60)) {
            let sa: RankSet = a.iter().copied().collect();
            let sb: RankSet = b.iter().copied().collect();
            let ba: BTreeSet<u32> = a.iter().copied().collect();
            let bb: BTreeSet<u32> = b.iter().copied().collect();
            prop_assert_eq!(sa.iter().collect::<Vec<_>>(), ba.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(sa.intersection(&sb).iter().collect::<Vec<_>>(), ba.intersection(&bb).copied().collect::<Vec<_>>());
            prop_assert_eq!(sa.difference(&sb).iter().collect::<Vec<_>>(), ba.difference(&bb).copied().collect::<Vec<_>>());
            let mut u = sa.clone();
            u.union_with(&sb);
            prop_assert_eq!(u.iter().collect::<Vec<_>>(), ba.union(&bb).copied().collect::<Vec<_>>());
            // The same ranges (merged, sorted) as inserting one by one gives.
            prop_assert_eq!(&u, &ba.union(&bb).copied().collect::<RankSet>());
            for r in 0..200 { prop_assert_eq!(sa.contains(r), ba.contains(&r)); }
            let mut buf = Vec::new();
            sa.encode(&mut buf);
            let mut rd = Reader::new(&buf);
            prop_assert_eq!(RankSet::decode(&mut rd).unwrap(), sa.clone());
            prop_assert_eq!(sa.to_string().parse::<RankSet>().unwrap(), sa);
        }
    }
}
