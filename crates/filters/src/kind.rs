//! The built-in transformation filters, by the names the wire carries.

use treecast_wire::FilterSpec;

/// Version of the built-in filters' behaviour (the same for all of them).
pub const BUILTIN_VERSION: u16 = 1;

/// The built-in transformation filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransformKind {
    /// Pass every packet through unchanged.
    Null,
    /// Element-wise sum of numeric values.
    Sum,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
    /// Element-wise average, weighted by the number of back-ends behind each packet.
    Avg,
    /// Concatenation of arrays (scalars become one-element arrays).
    Concat,
    /// Equivalence classes: ranks grouped by equal payload.
    EqClass,
}

impl TransformKind {
    /// Every built-in kind, for help texts and tests.
    pub const ALL: [TransformKind; 7] = [
        TransformKind::Null,
        TransformKind::Sum,
        TransformKind::Min,
        TransformKind::Max,
        TransformKind::Avg,
        TransformKind::Concat,
        TransformKind::EqClass,
    ];

    /// The lower-case name used on the wire, on command lines and in errors.
    pub fn name(self) -> &'static str {
        match self {
            TransformKind::Null => "null",
            TransformKind::Sum => "sum",
            TransformKind::Min => "min",
            TransformKind::Max => "max",
            TransformKind::Avg => "avg",
            TransformKind::Concat => "concat",
            TransformKind::EqClass => "eqclass",
        }
    }

    /// The built-in of this name, if there is one.
    pub fn from_name(name: &str) -> Option<TransformKind> {
        TransformKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// How the wire names this filter (no parameters).
    pub fn spec(self) -> FilterSpec {
        FilterSpec::new(self.name(), BUILTIN_VERSION)
    }
}

impl From<TransformKind> for FilterSpec {
    fn from(kind: TransformKind) -> FilterSpec {
        kind.spec()
    }
}
