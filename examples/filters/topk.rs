//! A treecast plug-in filter in Rust, through the `treecast-filter` crate: the k
//! largest distinct values seen so far.
//!
//! Parameters: `%ud`, k. Packets hold integers (scalars or arrays, e.g. `%d` or
//! `%ald`); each node sends up, as `%ald`, the k largest distinct values among its
//! children's and those it kept from earlier waves (its state), in decreasing order,
//! so the front-end reads the top k of the whole run so far. `set_params` takes a new k;
//! `adopt_state` merges a lost node's best values into this node's after a recovery.
//!
//! ```sh
//! cargo build --example topk_filter   # target/debug/examples/libtopk_filter.so
//! ```

use treecast_filter::{export_filter, Error, Filter, Output, Packet, Place, Value};

/// The filter's state on one node for one stream.
struct TopK {
    k: usize,
    best: Vec<i64>,
}

fn k_of(params: &[Value]) -> Result<usize, Error> {
    match params {
        [Value::UInt(k)] if *k > 0 => Ok(*k as usize),
        _ => Err(Error::params("topk takes one parameter: k (%ud, at least 1)")),
    }
}

impl Filter for TopK {
    fn create(params: &[Value], _place: &Place) -> Result<Self, Error> {
        Ok(TopK { k: k_of(params)?, best: Vec::new() })
    }

    fn reduce(&mut self, wave: &[Packet<'_>], _place: &Place, out: &mut Output<'_>) -> Result<(), Error> {
        let mut all = std::mem::take(&mut self.best);
        for packet in wave {
            for value in packet.values()? {
                match value.as_i64().map(|v| vec![v]).or_else(|| value.to_i64_vec()) {
                    Some(values) => all.extend(values),
                    None => {
                        let why = format!("expected integers, got \"{}\"", packet.format);
                        return Err(Error::packet(packet.rank, why));
                    }
                }
            }
        }
        all.sort_unstable_by(|a, b| b.cmp(a));
        // Distinct values: what a child reported in an earlier wave comes again with
        // its state, and must not count twice.
        all.dedup();
        all.truncate(self.k);
        self.best = all;
        let tag = wave.first().map_or(0, |p| p.tag);
        out.up(tag, &[Value::LongArray(self.best.clone())])
    }

    fn state(&self) -> Option<Vec<Value>> {
        Some(vec![Value::LongArray(self.best.clone())])
    }

    /// A lost node's best values join this node's: its children now report here.
    fn adopt_state(&mut self, state: &[Value]) -> Result<(), Error> {
        let [Value::LongArray(lost)] = state else {
            return Err(Error::new("a topk state is one %ald"));
        };
        self.best.extend(lost);
        self.best.sort_unstable_by(|a, b| b.cmp(a));
        self.best.dedup();
        self.best.truncate(self.k);
        Ok(())
    }

    fn set_params(&mut self, params: &[Value]) -> Result<(), Error> {
        self.k = k_of(params)?;
        self.best.truncate(self.k);
        Ok(())
    }
}

export_filter!(TopK, name = "topk", version = 1);
