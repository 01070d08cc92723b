//! Small helpers shared by the filters: format-string spelling, decoding with the
//! packet's rank in the error, the output header.

use bytes::Bytes;
use treecast_wire::{decode_values, encode_values, Format, Frame, FrameHeader, ScalarType, Value, ValueType};

use crate::{FilterContext, FilterError};

/// `%d`, `%alf`, `%b` ...
pub(crate) fn type_spec(t: ValueType) -> String {
    t.spec().to_owned()
}

/// The canonical format string of `f`, specifiers separated by one space.
pub(crate) fn format_string(f: &Format) -> String {
    f.to_string()
}

/// Parses a format string (what [`format_string`] writes).
pub(crate) fn parse_format(text: &str) -> Option<Format> {
    Format::parse(text).ok()
}

/// True for the ten numeric scalar types.
pub(crate) fn is_numeric(t: ScalarType) -> bool {
    !matches!(t, ScalarType::Str)
}

/// True for a numeric scalar or a numeric array.
pub(crate) fn is_numeric_type(t: ValueType) -> bool {
    match t {
        ValueType::Scalar(s) | ValueType::Array(s) => is_numeric(s),
        ValueType::Bytes => false,
    }
}

/// Decodes a frame's payload, naming the frame's rank on failure.
pub(crate) fn decode_frame(
    frame: &Frame,
    filter: &'static str,
    ctx: &FilterContext,
) -> Result<Vec<Value>, FilterError> {
    decode_values(&frame.payload).map_err(|e| FilterError::Decode {
        filter,
        stream: ctx.stream,
        rank: frame.header.rank,
        detail: e.to_string(),
    })
}

/// The header of a filter's output: data, the first frame's stream and tag, the
/// lowest source rank of the wave, no timestamp, `flags`.
pub(crate) fn output_header(wave: &[Frame], flags: u16) -> FrameHeader {
    let (stream, tag) = wave.first().map_or((0, 0), |f| (f.header.stream, f.header.tag));
    let rank = wave.iter().map(|f| f.header.rank).min().unwrap_or(0);
    let mut h = FrameHeader::data(stream, tag, rank);
    h.flags = flags;
    h
}

/// Encodes `values` into a payload.
pub(crate) fn encode(values: &[Value]) -> Bytes {
    let mut out = Vec::new();
    encode_values(values, &mut out);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_strings_round_trip() {
        let text = "%c %uc %hd %uhd %d %ud %ld %uld %f %lf %s %ac %auc %ahd %auhd %ad %aud %ald %auld %af %alf %as %b";
        let f = parse_format(text).expect("parses");
        assert_eq!(f.types.len(), 23);
        assert_eq!(format_string(&f), text);
        assert_eq!(parse_format(""), Some(Format::default()));
        assert_eq!(parse_format("%q"), None);
        assert_eq!(parse_format("d"), None);
    }
}
