//! Packets as a tool sees them.

use bytes::Bytes;
use treecast_filters::decode_eq_classes;
use treecast_wire::{decode_values, Format, Frame, RankSet, Value};

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
    pub(crate) fn from_frame(frame: Frame) -> Self {
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

    /// Decodes the payload into values.
    ///
    /// # Errors
    /// [`ApiError::Decode`] if the payload is malformed.
    pub fn values(&self) -> Result<Vec<Value>, ApiError> {
        Ok(decode_values(&self.frame.payload)?)
    }

    /// Decodes the payload and checks it against `format` (e.g. `"%d %s"`).
    ///
    /// # Errors
    /// A malformed format, a malformed payload, or values that do not match,
    /// naming the first that does not.
    pub fn unpack(&self, format: &str) -> Result<Vec<Value>, ApiError> {
        let format = Format::parse(format)?;
        let values = self.values()?;
        format.check(&values)?;
        Ok(values)
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
