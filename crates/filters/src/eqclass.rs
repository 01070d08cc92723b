//! Equivalence classes: back-end ranks grouped by equal payload bytes.
//!
//! A packet without [`FLAG_EQCLASS`] is one member: its key is its payload bytes and
//! its rank set the rank in its header. The output is always a table flagged
//! [`FLAG_EQCLASS`] whose payload is:
//!
//! 1. `%ud`: the number of classes `n`;
//! 2. `n` times: `%b` the key (the representative payload, as the back-end sent
//!    it), `%aud` the starts and `%aud` the inclusive ends of the class's rank ranges.
//!
//! Tables in the input are decoded and merged (same key: union of the rank sets).
//! Classes are ordered by their smallest rank. Since the output has the same shape at
//! every level, the filter composes: reducing in two levels gives the same table as
//! reducing all back-end packets at once.

use std::collections::HashMap;

use bytes::Bytes;
use treecast_wire::{decode_values, Frame, RankSet, Value, FLAG_EQCLASS};

use crate::spec::{encode, output_header};
use crate::{FilterContext, FilterError, Transform};

const NAME: &str = "eqclass";

/// The classes a frame carries: its table if it is flagged [`FLAG_EQCLASS`],
/// otherwise one class holding its payload and its header's rank.
///
/// # Errors
/// [`FilterError::Decode`] if a flagged payload does not decode,
/// [`FilterError::Malformed`] if it is not a class table (wrong count or types,
/// ranges out of order, a class without ranks).
pub fn decode_eq_classes(frame: &Frame) -> Result<Vec<(Bytes, RankSet)>, FilterError> {
    let rank = frame.header.rank;
    let stream = frame.header.stream;
    if frame.header.flags & FLAG_EQCLASS == 0 {
        return Ok(vec![(frame.payload.clone(), RankSet::single(rank))]);
    }
    let values = decode_values(&frame.payload).map_err(|e| FilterError::Decode {
        filter: NAME,
        stream,
        rank,
        detail: e.to_string(),
    })?;
    let malformed = |detail: String| FilterError::Malformed { filter: NAME, stream, rank, detail };
    let mut it = values.into_iter();
    let Some(Value::UInt(n)) = it.next() else {
        return Err(malformed("an equivalence-class table must start with a %ud count".into()));
    };
    let rest: Vec<Value> = it.collect();
    if rest.len() as u64 != u64::from(n) * 3 {
        return Err(malformed(format!(
            "the table announces {n} classes but has {} values after the count",
            rest.len()
        )));
    }
    let mut classes = Vec::with_capacity(rest.len() / 3);
    let mut rest = rest.into_iter();
    let mut index = 0;
    while let (Some(k), Some(s), Some(e)) = (rest.next(), rest.next(), rest.next()) {
        let (Value::Bytes(key), Value::UIntArray(starts), Value::UIntArray(ends)) = (k, s, e) else {
            return Err(malformed(format!("class {index} is not %b %aud %aud")));
        };
        if starts.len() != ends.len() || starts.is_empty() {
            return Err(malformed(format!(
                "class {index} has {} range starts and {} range ends; it needs at least one range",
                starts.len(),
                ends.len()
            )));
        }
        let mut set = RankSet::new();
        for (lo, hi) in starts.into_iter().zip(ends) {
            if lo > hi {
                return Err(malformed(format!("class {index} has the range {lo}-{hi}, which is reversed")));
            }
            set.insert_range(lo, hi);
        }
        classes.push((Bytes::from(key), set));
        index += 1;
    }
    Ok(classes)
}

/// A frame flagged [`FLAG_EQCLASS`] carrying `classes` in the given order (the
/// filter orders them by smallest rank), on `stream` with `tag`; its header rank is
/// the smallest rank of all classes (0 if there is none).
pub fn eq_classes_frame(stream: u32, tag: i32, classes: &[(Bytes, RankSet)]) -> Frame {
    let mut values = Vec::with_capacity(1 + 3 * classes.len());
    values.push(Value::UInt(u32::try_from(classes.len()).unwrap_or(u32::MAX)));
    for (key, set) in classes {
        values.push(Value::Bytes(key.to_vec()));
        values.push(Value::UIntArray(set.ranges().iter().map(|r| r.0).collect()));
        values.push(Value::UIntArray(set.ranges().iter().map(|r| r.1).collect()));
    }
    let rank = classes.iter().filter_map(|(_, s)| s.first()).min().unwrap_or(0);
    let mut header = treecast_wire::FrameHeader::data(stream, tag, rank);
    header.flags = FLAG_EQCLASS;
    Frame::new(header, encode(&values))
}

/// The equivalence-class filter; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct EqClass;

impl Transform for EqClass {
    fn apply(&mut self, wave: Vec<Frame>, ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        self.apply_borrowed(&wave, ctx)
    }

    fn apply_borrowed(&mut self, wave: &[Frame], _ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        if wave.is_empty() {
            return Ok(Vec::new());
        }
        let mut classes: Vec<(Bytes, RankSet)> = Vec::new();
        let mut by_key: HashMap<Bytes, usize> = HashMap::new();
        for frame in wave {
            for (key, set) in decode_eq_classes(frame)? {
                match by_key.get(&key) {
                    Some(&i) => classes[i].1.union_with(&set),
                    None => {
                        by_key.insert(key.clone(), classes.len());
                        classes.push((key, set));
                    }
                }
            }
        }
        classes.sort_by_key(|(_, s)| s.first());
        let header = output_header(wave, FLAG_EQCLASS);
        let mut out = eq_classes_frame(header.stream, header.tag, &classes);
        out.header.rank = header.rank;
        Ok(vec![out])
    }
}
