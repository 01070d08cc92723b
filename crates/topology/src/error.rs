//! The one error type of this crate.

/// Everything that can go wrong while reading, generating or validating a topology.
///
/// Errors that come from topology text carry the 1-based `line` and `column` (counted in
/// characters) of the offending token, and their message starts with
/// `topology line L, column C:`. Generator errors name the spec that was wrong and what
/// is accepted instead.
#[non_exhaustive]
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum TopologyError {
    /// The text holds no statement at all (only blanks and comments).
    #[error("topology is empty: expected at least `host:0 ;`")]
    Empty,

    /// A character that cannot start any token (a lone `=` or `>`, for example).
    #[error("topology line {line}, column {column}: unexpected character `{ch}`: {expected}")]
    UnexpectedChar {
        /// Line of the character.
        line: usize,
        /// Column of the character.
        column: usize,
        /// The character found.
        ch: char,
        /// What would have been accepted here.
        expected: String,
    },

    /// A well-formed token in a place where the grammar does not allow it.
    #[error("topology line {line}, column {column}: expected {expected}, found {found}")]
    UnexpectedToken {
        /// Line of the token.
        line: usize,
        /// Column of the token.
        column: usize,
        /// The token found, quoted.
        found: String,
        /// What would have been accepted here.
        expected: String,
    },

    /// A parent node followed by another node without `=>` between them.
    #[error(
        "topology line {line}, column {column}: expected `=>` or `;` after {node}, found {found} \
         (write `{node} => {found} ;`)"
    )]
    MissingArrow {
        /// Line of the token found instead of `=>`.
        line: usize,
        /// Column of the token found instead of `=>`.
        column: usize,
        /// The node that starts the statement.
        node: String,
        /// The token found instead of `=>`.
        found: String,
    },

    /// A statement that is not terminated by `;`.
    #[error(
        "topology line {line}, column {column}: missing `;` to end the statement that starts at \
         line {statement_line}, column {statement_column}"
    )]
    MissingSemicolon {
        /// Where the `;` was expected: the token that seems to start the next statement,
        /// or just after the last token of the text.
        line: usize,
        /// Column where the `;` was expected.
        column: usize,
        /// Line of the first token of the unterminated statement.
        statement_line: usize,
        /// Column of the first token of the unterminated statement.
        statement_column: usize,
    },

    /// `parent => ;`: an arrow with no child after it.
    #[error("topology line {line}, column {column}: expected at least one child after `=>` for {node}")]
    MissingChild {
        /// Line of the `;` found.
        line: usize,
        /// Column of the `;` found.
        column: usize,
        /// The parent of the statement.
        node: String,
    },

    /// A node token without the `:index` part.
    #[error("topology line {line}, column {column}: `{token}` is not a node: expected `host:index`")]
    MissingIndex {
        /// Line of the token.
        line: usize,
        /// Column of the token.
        column: usize,
        /// The whole token.
        token: String,
    },

    /// The part after the last `:` is not a non-negative integer that fits in 32 bits.
    #[error(
        "topology line {line}, column {column}: bad index in `{token}`: expected a non-negative \
         integer below 2^32"
    )]
    BadIndex {
        /// Line of the index.
        line: usize,
        /// Column of the first character of the index.
        column: usize,
        /// The whole node token.
        token: String,
    },

    /// A node token with nothing before the `:` (or nothing between `@` and `:`).
    #[error("topology line {line}, column {column}: empty host name in `{token}`")]
    EmptyHost {
        /// Line of the token.
        line: usize,
        /// Column of the token.
        column: usize,
        /// The whole node token.
        token: String,
    },

    /// A host name with a character other than letters, digits, `.`, `-` and `_` (and one
    /// `@` after a user name).
    #[error(
        "topology line {line}, column {column}: host name in `{token}` has the character `{ch}`; \
         host names may hold letters, digits, `.`, `-` and `_`"
    )]
    BadHost {
        /// Line of the bad character.
        line: usize,
        /// Column of the bad character.
        column: usize,
        /// The whole node token.
        token: String,
        /// The offending character.
        ch: char,
    },

    /// A host name that starts with something other than a letter or a digit (a user
    /// name may also start with `_`): MRNet's lexer refuses it, and a leading `-` could
    /// be taken for an option by ssh or srun.
    #[error(
        "topology line {line}, column {column}: host name in `{token}` starts with `{ch}`; a host \
         name starts with a letter or a digit, so that ssh or srun can never take it for an option"
    )]
    BadHostStart {
        /// Line of the character.
        line: usize,
        /// Column of the character.
        column: usize,
        /// The whole node token.
        token: String,
        /// The offending character.
        ch: char,
    },

    /// `@host:index`: an `@` with no user name before it.
    #[error("topology line {line}, column {column}: empty user name in `{token}`: write `user@host:index`")]
    EmptyUser {
        /// Line of the token.
        line: usize,
        /// Column of the token.
        column: usize,
        /// The whole node token.
        token: String,
    },

    /// A node listed as a child of itself.
    #[error("topology line {line}, column {column}: node {node} is listed as its own child")]
    SelfChild {
        /// Line of the child occurrence.
        line: usize,
        /// Column of the child occurrence.
        column: usize,
        /// The node.
        node: String,
    },

    /// A node listed twice as a child of the same parent.
    #[error(
        "topology line {line}, column {column}: node {node} is listed twice as a child of {parent} \
         (first at line {first_line}, column {first_column})"
    )]
    DuplicateChild {
        /// Line of the second occurrence.
        line: usize,
        /// Column of the second occurrence.
        column: usize,
        /// The child listed twice.
        node: String,
        /// Its parent.
        parent: String,
        /// Line of the first occurrence.
        first_line: usize,
        /// Column of the first occurrence.
        first_column: usize,
    },

    /// A node listed as a child of two different parents.
    #[error(
        "topology line {line}, column {column}: node {node} has two parents \
         (first at line {first_line}, column {first_column})"
    )]
    TwoParents {
        /// Line of the second occurrence as a child.
        line: usize,
        /// Column of the second occurrence as a child.
        column: usize,
        /// The node.
        node: String,
        /// Line of the first occurrence as a child.
        first_line: usize,
        /// Column of the first occurrence as a child.
        first_column: usize,
    },

    /// A node written with a different `user@` (or none) than at its first mention.
    #[error(
        "topology line {line}, column {column}: node {node} is written {first} at line \
         {first_line}, column {first_column}; write the same `user@` (or none) at every mention"
    )]
    UserMismatch {
        /// Line of the mention that differs.
        line: usize,
        /// Column of the mention that differs.
        column: usize,
        /// The node as written there.
        node: String,
        /// The node as written first.
        first: String,
        /// Line of the first mention.
        first_line: usize,
        /// Column of the first mention.
        first_column: usize,
    },

    /// Parent links that go round in a circle.
    #[error("topology line {line}, column {column}: cycle: {path}")]
    Cycle {
        /// Line of the child occurrence that closes the cycle (the last one in the text).
        line: usize,
        /// Column of that occurrence.
        column: usize,
        /// The nodes of the cycle, `a:1 => b:1 => a:1`.
        path: String,
    },

    /// Every node is the child of another: there is no root.
    #[error("topology line {line}, column {column}: no root: every node is listed as a child ({path})")]
    NoRoot {
        /// Line of the first statement.
        line: usize,
        /// Column of the first statement.
        column: usize,
        /// One cycle found, `a:1 => b:1 => a:1`.
        path: String,
    },

    /// A lone `host:index ;` statement for a node that is never a child, in a text that
    /// already has a root.
    #[error(
        "topology line {line}, column {column}: more than one root: {node} is never listed as a \
         child, but the root is {root} (line {root_line}, column {root_column})"
    )]
    MultipleRoots {
        /// Line of the extra root.
        line: usize,
        /// Column of the extra root.
        column: usize,
        /// The extra root.
        node: String,
        /// The root of the tree (the top of the first statement).
        root: String,
        /// Line of the root's first statement.
        root_line: usize,
        /// Column of the root's first statement.
        root_column: usize,
    },

    /// A statement whose parent is never a child, so it is not connected to the root.
    #[error(
        "topology line {line}, column {column}: the statement for {node} is not connected to the \
         root {root} (line {root_line}, column {root_column}): {node} is never listed as a child"
    )]
    Unreachable {
        /// Line of the statement's parent token.
        line: usize,
        /// Column of the statement's parent token.
        column: usize,
        /// The unconnected node.
        node: String,
        /// The root of the tree (the top of the first statement).
        root: String,
        /// Line of the root's first statement.
        root_line: usize,
        /// Column of the root's first statement.
        root_column: usize,
    },

    /// The text names more nodes than [`MAX_NODES`](crate::MAX_NODES).
    #[error(
        "topology line {line}, column {column}: more than {limit} nodes; trees are limited to {limit} nodes"
    )]
    TooManyNodes {
        /// Line of the first node over the limit.
        line: usize,
        /// Column of the first node over the limit.
        column: usize,
        /// The limit.
        limit: usize,
    },

    /// A topology file, with the error found in it.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// What is wrong in it.
        source: Box<TopologyError>,
    },

    /// A topology file that cannot be read (and the spec is no generator spec either).
    #[error(
        "cannot read topology file {path}: {reason}; a topology spec is flat, kary:K, knomial:K, \
         balanced:AxB..., fanout:F or a topology file"
    )]
    ReadFile {
        /// The path.
        path: String,
        /// The operating system's reason.
        reason: String,
    },

    /// A generator spec that cannot be understood.
    #[error(
        "bad topology spec `{spec}`: {reason}; accepted: flat, kary:K, knomial:K, balanced:AxB..., fanout:F"
    )]
    BadSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },

    /// `kary:K`, `fanout:F` or `knomial:K` with K below 2.
    #[error("bad topology spec `{spec}`: the fan-out must be at least 2 (a fan-out of 1 makes a chain)")]
    FanoutTooSmall {
        /// The spec.
        spec: String,
    },

    /// A generator that needs a back-end count got none.
    #[error("topology spec `{spec}` needs a back-end count (N)")]
    MissingBackendCount {
        /// The spec.
        spec: String,
    },

    /// A back-end count of zero.
    #[error("a tree needs at least one back-end")]
    NoBackends,

    /// A spec or file whose back-end count differs from the one asked for.
    #[error("{what} has {has} back-ends but {asked} were asked for")]
    BackendMismatch {
        /// The spec or file (`balanced:4x4`, `topology file x.top`).
        what: String,
        /// Its number of back-ends.
        has: usize,
        /// The number asked for.
        asked: usize,
    },

    /// A generator spec that would build more than [`MAX_NODES`](crate::MAX_NODES) nodes.
    #[error("{what} needs more than {limit} nodes; trees are limited to {limit} nodes")]
    TooLarge {
        /// The spec and back-end count.
        what: String,
        /// The limit.
        limit: usize,
    },

    /// A host name given to a generator that the text format cannot hold.
    #[error("bad host name `{host}`: {reason}")]
    BadHostName {
        /// The host name.
        host: String,
        /// What is wrong with it, and what is accepted.
        reason: String,
    },

    /// A host-list expression ([`hostlist::HostList`](crate::hostlist::HostList)) that
    /// cannot be read: unbalanced brackets, an empty item or range, a non-numeric or
    /// reversed range, a bad step, a character that cannot be in a host name, a host
    /// that does not start with a letter or a digit, or too many hosts.
    #[error("host list `{expr}`, column {column}: {reason}")]
    BadHostList {
        /// The expression as given.
        expr: String,
        /// 1-based column, in characters, of what is wrong.
        column: usize,
        /// What is wrong, and what is accepted.
        reason: String,
    },

    /// A `^FILE` of a host list that cannot be read.
    #[error("cannot read host file {path}: {reason}")]
    ReadHostFile {
        /// The path, as written after `^`.
        path: String,
        /// The operating system's reason, or what is wrong with the contents.
        reason: String,
    },

    /// A line of a `^FILE` that cannot be read as a host list.
    #[error("host file {path}, line {line}: {source}")]
    HostFile {
        /// The path, as written after `^`.
        path: String,
        /// 1-based line of the error.
        line: usize,
        /// What is wrong on that line ([`TopologyError::BadHostList`], columns counted
        /// on the line).
        source: Box<TopologyError>,
    },

    /// A list of hosts given to a generator that holds the same host twice.
    #[error("host `{host}` is listed twice (entries {first} and {second}, counted from 1); a host may be listed once")]
    RepeatedHost {
        /// The host.
        host: String,
        /// Position of its first entry, from 1.
        first: usize,
        /// Position of its second entry, from 1.
        second: usize,
    },

    /// A host-based generator got an empty list of hosts.
    #[error("a host-based tree needs at least one host")]
    NoHosts,
}
