//! Packets as a tool sees them.

use bytes::Bytes;
use treecast_filters::decode_eq_classes;
use treecast_wire::{decode_values, Frame, RankSet, Value, FLAG_EQCLASS};

use crate::ApiError;

/// One packet received on a stream: tag, source rank and typed values.
///
/// Cloning shares the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    frame: Frame,
}

/// One equivalence class: the values some ranks sent, and those ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct EqClass {
    /// The values every rank of the class sent.
    pub values: Vec<Value>,
    /// The ranks, kept as compact ranges.
    pub ranks: RankSet,
}

impl Packet {
    /// The packet a received data frame carries: what [`crate::Stream::recv`] and
    /// [`crate::BackEnd::recv`] return, for code that handles packets (file
    /// distribution, say) to be tested without a network.
    pub fn from_frame(frame: Frame) -> Self {
        // Small payloads were copied out of their read buffer by the link; large ones
        // are exactly their own bytes, so keeping a packet pins nothing else.
        Packet { frame }
    }

    /// The stream it arrived on.
    pub fn stream(&self) -> u32 {
        self.frame.header.stream
    }

    /// The tag its sender chose.
    pub fn tag(&self) -> i32 {
        self.frame.header.tag
    }

    /// The source rank (for a reduction, the lowest rank of the wave).
    pub fn rank(&self) -> u32 {
        self.frame.header.rank
    }

    /// The raw encoded payload.
    pub fn payload(&self) -> &Bytes {
        &self.frame.payload
    }

    /// True for the output of the equivalence-class filter (`eqclass`): read it with
    /// [`Packet::eq_classes`].
    pub fn is_eq_classes(&self) -> bool {
        self.frame.header.flags & FLAG_EQCLASS != 0
    }

    /// Decodes the payload into values, whatever their types (for an
    /// equivalence-class packet, the raw table: see [`Packet::eq_classes`]).
    ///
    /// # Errors
    /// [`ApiError::Decode`] if the payload is malformed.
    pub fn values(&self) -> Result<Vec<Value>, ApiError> {
        Ok(decode_values(&self.frame.payload)?)
    }

    /// Decodes the payload and checks it against `format` (e.g. `"%d %s"`): the
    /// values come back in the format's order, one [`Value`] variant per specifier.
    ///
    /// # Errors
    /// A malformed format, a malformed payload, or values that do not match, naming
    /// the first that does not; [`ApiError::EqClassPacket`] for the output of the
    /// equivalence-class filter, which [`Packet::eq_classes`] reads.
    pub fn unpack(&self, format: &str) -> Result<Vec<Value>, ApiError> {
        crate::encoding::with_format(format, |format| {
            if self.is_eq_classes() {
                return Err(ApiError::EqClassPacket { stream: self.stream() });
            }
            let values = self.values()?;
            format.check(&values)?;
            Ok(values)
        })?
    }

    /// A packet of `values` from the same stream, tag and rank: one class of an
    /// equivalence-class table as a plain packet, for code that reads packets by
    /// format (the C API's class reader).
    pub fn with_values(&self, values: &[Value]) -> Packet {
        let mut payload = Vec::new();
        treecast_wire::encode_values(values, &mut payload);
        let mut header = self.frame.header;
        header.flags &= !FLAG_EQCLASS;
        Packet { frame: Frame::new(header, payload) }
    }

    /// Reads a packet produced by the equivalence-class filter.
    ///
    /// # Errors
    /// The packet is not an equivalence-class table, or a class's values do not decode.
    pub fn eq_classes(&self) -> Result<Vec<EqClass>, ApiError> {
        let classes = decode_eq_classes(&self.frame)
            .map_err(|source| ApiError::Filter { stream: self.stream(), source })?;
        classes.into_iter().map(|(key, ranks)| Ok(EqClass { values: decode_values(&key)?, ranks })).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use treecast_filters::eq_classes_frame;

    #[test]
    fn unpack_on_an_equivalence_class_table_points_to_eq_classes() {
        // Regression: it said "format \"%d\" names 1 values but 10 were given".
        let mut key = Vec::new();
        treecast_wire::encode_values(&[Value::Int(4)], &mut key);
        let frame = eq_classes_frame(3, 0, &[(Bytes::from(key), RankSet::range(0, 4))]);
        let p = Packet::from_frame(frame);
        assert!(p.is_eq_classes());
        let err = p.unpack("%d").unwrap_err();
        assert!(matches!(err, ApiError::EqClassPacket { stream: 3 }), "{err:?}");
        assert!(err.to_string().contains("read it with Packet::eq_classes()"), "{err}");
        let classes = p.eq_classes().unwrap();
        assert_eq!(classes, [EqClass { values: vec![Value::Int(4)], ranks: RankSet::range(0, 4) }]);
        let one = p.with_values(&classes[0].values);
        assert!(!one.is_eq_classes());
        assert_eq!((one.stream(), one.unpack("%d").unwrap()), (3, vec![Value::Int(4)]));
    }
}
