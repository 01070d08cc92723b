//! The MRNet text format: tokens, statements, then validation into a tree.

use std::collections::HashMap;

use crate::hostname::{check_name, NameFault};
use crate::{Topology, TopologyError, MAX_NODES};

/// A place in the text: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pos {
    line: usize,
    column: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Node { host: String, index: u32, text: String },
    Arrow,
    Semi,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Node { text, .. } => format!("`{text}`"),
            Tok::Arrow => "`=>`".to_string(),
            Tok::Semi => "`;`".to_string(),
        }
    }
}

/// Characters that end a node token.
fn ends_word(c: char) -> bool {
    c.is_whitespace() || matches!(c, ';' | '#' | '=' | '>')
}

/// Splits the text into tokens with their positions; also returns the position just
/// after the last token.
fn tokenize(text: &str) -> Result<(Vec<(Tok, Pos)>, Pos), TopologyError> {
    let mut toks = Vec::new();
    let mut chars = text.chars().peekable();
    let (mut line, mut column) = (1usize, 1usize);
    let mut end = Pos { line: 1, column: 1 };
    while let Some(&c) = chars.peek() {
        let pos = Pos { line, column };
        if c == '\n' {
            chars.next();
            line += 1;
            column = 1;
        } else if c.is_whitespace() {
            chars.next();
            column += 1;
        } else if c == '#' {
            while let Some(&c) = chars.peek() {
                if c == '\n' {
                    break;
                }
                chars.next();
                column += 1;
            }
        } else if c == ';' {
            chars.next();
            column += 1;
            toks.push((Tok::Semi, pos));
            end = Pos { line, column };
        } else if c == '=' || c == '>' {
            chars.next();
            column += 1;
            if c == '=' && chars.peek() == Some(&'>') {
                chars.next();
                column += 1;
                toks.push((Tok::Arrow, pos));
                end = Pos { line, column };
            } else {
                return Err(TopologyError::UnexpectedChar {
                    line: pos.line,
                    column: pos.column,
                    ch: c,
                    expected: "the only operator is `=>`".to_string(),
                });
            }
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if ends_word(c) {
                    break;
                }
                word.push(c);
                chars.next();
                column += 1;
            }
            let tok = node_token(word, pos)?;
            toks.push((tok, pos));
            end = Pos { line, column };
        }
    }
    Ok((toks, end))
}

/// Checks one `host:index` word.
fn node_token(word: String, pos: Pos) -> Result<Tok, TopologyError> {
    let Some(colon) = word.rfind(':') else {
        return Err(TopologyError::MissingIndex { line: pos.line, column: pos.column, token: word });
    };
    let host = &word[..colon];
    let digits = &word[colon + 1..];
    if let Err((k, fault)) = check_name(host) {
        let (line, column) = (pos.line, pos.column + k);
        return Err(match fault {
            NameFault::Char(ch) => TopologyError::BadHost { line, column, token: word, ch },
            NameFault::Start(ch) => TopologyError::BadHostStart { line, column, token: word, ch },
            NameFault::EmptyUser => TopologyError::EmptyUser { line, column, token: word },
            NameFault::EmptyHost => TopologyError::EmptyHost { line, column, token: word },
        });
    }
    let index = if digits.bytes().all(|b| b.is_ascii_digit()) { digits.parse::<u32>().ok() } else { None };
    let Some(index) = index else {
        let column = pos.column + host.chars().count() + 1;
        return Err(TopologyError::BadIndex { line: pos.line, column, token: word });
    };
    Ok(Tok::Node { host: host.to_string(), index, text: word })
}

/// One statement: a parent and its children (none for a lone `host:index ;`).
struct Statement {
    parent: (usize, Pos),
    children: Vec<(usize, Pos)>,
}

/// The distinct nodes of a text, numbered in order of first appearance. A node is its
/// host (without `user@`) and index; every mention must spell it the same way.
#[derive(Default)]
struct Interner {
    ids: HashMap<(String, u32), usize>,
    names: Vec<(String, u32)>,
    first: Vec<Pos>,
}

impl Interner {
    fn intern(&mut self, host: String, index: u32, pos: Pos) -> Result<usize, TopologyError> {
        let next = self.names.len();
        let key = (crate::hostname::bare_host(&host).to_string(), index);
        if let Some(&id) = self.ids.get(&key) {
            if self.names[id].0 != host {
                let first = self.first[id];
                return Err(TopologyError::UserMismatch {
                    line: pos.line,
                    column: pos.column,
                    node: format!("{host}:{index}"),
                    first: self.name(id),
                    first_line: first.line,
                    first_column: first.column,
                });
            }
            return Ok(id);
        }
        if next >= MAX_NODES {
            return Err(TopologyError::TooManyNodes { line: pos.line, column: pos.column, limit: MAX_NODES });
        }
        self.names.push((host, index));
        self.first.push(pos);
        self.ids.insert(key, next);
        Ok(next)
    }

    fn name(&self, id: usize) -> String {
        let (host, index) = &self.names[id];
        format!("{host}:{index}")
    }
}

/// Reads the statements of the text.
fn statements(text: &str, nodes: &mut Interner) -> Result<Vec<Statement>, TopologyError> {
    let (toks, end) = tokenize(text)?;
    let mut out = Vec::new();
    let mut it = toks.into_iter().peekable();
    while let Some((tok, pos)) = it.next() {
        let Tok::Node { host, index, text } = tok else {
            return Err(TopologyError::UnexpectedToken {
                line: pos.line,
                column: pos.column,
                found: tok.describe(),
                expected: "a node `host:index` to start a statement".to_string(),
            });
        };
        let parent = (nodes.intern(host, index, pos)?, pos);
        let missing_semi = |at: Pos| TopologyError::MissingSemicolon {
            line: at.line,
            column: at.column,
            statement_line: pos.line,
            statement_column: pos.column,
        };
        match it.next() {
            None => return Err(missing_semi(end)),
            Some((Tok::Semi, _)) => {
                out.push(Statement { parent, children: Vec::new() });
                continue;
            }
            Some((Tok::Arrow, _)) => {}
            Some((found @ Tok::Node { .. }, at)) => {
                return Err(TopologyError::MissingArrow {
                    line: at.line,
                    column: at.column,
                    node: text,
                    found: found.describe().trim_matches('`').to_string(),
                });
            }
        }
        let mut children: Vec<(usize, Pos)> = Vec::new();
        loop {
            match it.next() {
                None => return Err(missing_semi(end)),
                Some((Tok::Semi, at)) => {
                    if children.is_empty() {
                        return Err(TopologyError::MissingChild {
                            line: at.line,
                            column: at.column,
                            node: text,
                        });
                    }
                    break;
                }
                Some((Tok::Arrow, at)) => {
                    // `a => b c  d => e ;`: the `;` is missing before `d`, the node just
                    // read, which starts the next statement.
                    return Err(match children.last() {
                        Some(&(_, last)) => missing_semi(last),
                        None => TopologyError::UnexpectedToken {
                            line: at.line,
                            column: at.column,
                            found: "`=>`".to_string(),
                            expected: "a child `host:index`".to_string(),
                        },
                    });
                }
                Some((Tok::Node { host, index, .. }, at)) => {
                    children.push((nodes.intern(host, index, at)?, at))
                }
            }
        }
        out.push(Statement { parent, children });
    }
    Ok(out)
}

impl Topology {
    /// Parses the MRNet text format; see the crate documentation and
    /// `docs/topology-format.md`.
    ///
    /// # Errors
    ///
    /// Returns an error naming the line and column of the offending token for syntax
    /// errors (missing `=>` or `;`, a bad index, an empty or bad host name), a node with
    /// two parents or listed twice, a node starting two statements, a cycle, no root or
    /// more than one root, a statement not connected to the root, and more than
    /// [`MAX_NODES`] nodes; [`TopologyError::Empty`] for a text without statements.
    pub fn parse(text: &str) -> Result<Topology, TopologyError> {
        parse(text)
    }
}
impl std::str::FromStr for Topology {
    type Err = TopologyError;

    /// The same as [`Topology::parse`].
    fn from_str(s: &str) -> Result<Topology, TopologyError> {
        Topology::parse(s)
    }
}

/// Parses and validates topology text.
pub(crate) fn parse(text: &str) -> Result<Topology, TopologyError> {
    let mut names = Interner::default();
    let stmts = statements(text, &mut names)?;
    if stmts.is_empty() {
        return Err(TopologyError::Empty);
    }
    let n = names.names.len();
    // Per node: where it first starts a statement, its parent and where it is listed as a child.
    let mut defined: Vec<Option<Pos>> = vec![None; n];
    let mut parent: Vec<Option<(usize, Pos)>> = vec![None; n];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for st in &stmts {
        let (p, ppos) = st.parent;
        // As in MRNet, a parent may come back in later statements: its children are
        // appended in statement order.
        defined[p].get_or_insert(ppos);
        for &(c, cpos) in &st.children {
            if c == p {
                return Err(TopologyError::SelfChild {
                    line: cpos.line,
                    column: cpos.column,
                    node: names.name(c),
                });
            }
            if let Some((q, first)) = parent[c] {
                return Err(if q == p {
                    TopologyError::DuplicateChild {
                        line: cpos.line,
                        column: cpos.column,
                        node: names.name(c),
                        parent: names.name(p),
                        first_line: first.line,
                        first_column: first.column,
                    }
                } else {
                    TopologyError::TwoParents {
                        line: cpos.line,
                        column: cpos.column,
                        node: names.name(c),
                        first_line: first.line,
                        first_column: first.column,
                    }
                });
            }
            parent[c] = Some((p, cpos));
            children[p].push(c);
        }
    }

    // Every node has at most one parent now, so following parents from any node either
    // reaches a root or enters a cycle.
    let roots: Vec<usize> = (0..n).filter(|&i| parent[i].is_none()).collect();
    if let Some((path, at)) = find_cycle(&parent, &names) {
        if roots.is_empty() {
            let first = stmts[0].parent.1;
            return Err(TopologyError::NoRoot { line: first.line, column: first.column, path });
        }
        return Err(TopologyError::Cycle { line: at.line, column: at.column, path });
    }

    // The root is the top of the first statement's branch.
    let mut root = stmts[0].parent.0;
    while let Some((p, _)) = parent[root] {
        root = p;
    }
    let root_pos = defined[root].unwrap_or(stmts[0].parent.1);
    if let Some(&other) = roots.iter().find(|&&r| r != root) {
        // Every node is either listed as a child or starts a statement, so a root always
        // has a statement.
        let at = defined[other].unwrap_or(root_pos);
        let (node, root_name) = (names.name(other), names.name(root));
        return Err(if children[other].is_empty() {
            TopologyError::MultipleRoots {
                line: at.line,
                column: at.column,
                node,
                root: root_name,
                root_line: root_pos.line,
                root_column: root_pos.column,
            }
        } else {
            TopologyError::Unreachable {
                line: at.line,
                column: at.column,
                node,
                root: root_name,
                root_line: root_pos.line,
                root_column: root_pos.column,
            }
        });
    }

    let Interner { names, .. } = names;
    let mut names: Vec<Option<(String, u32)>> = names.into_iter().map(Some).collect();
    Ok(Topology::from_children(root, &children, |old, _| names[old].take().unwrap_or_default()))
}

/// Finds a cycle of parent links; returns it as text (`a:1 => b:1 => a:1`, parents
/// first) and the position of the child occurrence that closes it (the latest in the
/// text).
/// Nodes of a cycle named in its error; a longer cycle is cut, with its length.
const CYCLE_SHOWN: usize = 6;

fn find_cycle(parent: &[Option<(usize, Pos)>], names: &Interner) -> Option<(String, Pos)> {
    // 0: not seen, 1: on the current walk, 2: known to reach a root or a known cycle.
    let mut state = vec![0u8; parent.len()];
    for start in 0..parent.len() {
        if state[start] != 0 {
            continue;
        }
        let mut walk = Vec::new();
        let mut cur = start;
        loop {
            if state[cur] == 2 {
                break;
            }
            if state[cur] == 1 {
                // `cur` is on this walk: the cycle is from its place to the end.
                let from = walk.iter().position(|&w| w == cur).unwrap_or(0);
                // Parents first: in `walk` each node's parent follows it, so reverse it.
                let mut cycle: Vec<usize> = walk[from..].iter().rev().copied().collect();
                let closing = (0..cycle.len()).max_by_key(|&k| parent[cycle[k]].map(|(_, pos)| pos))?;
                let at = parent[cycle[closing]].map(|(_, pos)| pos);
                // Start the text with the parent of the closing occurrence.
                let len = cycle.len();
                cycle.rotate_left((closing + len - 1) % len);
                let mut text =
                    cycle.iter().take(CYCLE_SHOWN).map(|&c| names.name(c)).collect::<Vec<_>>().join(" => ");
                if len > CYCLE_SHOWN {
                    // A cycle of 400,000 nodes would make a line of megabytes.
                    text.push_str(&format!(" => … => {} ({len} nodes in the cycle)", names.name(cycle[0])));
                } else {
                    text.push_str(&format!(" => {}", names.name(cycle[0])));
                }
                return at.map(|at| (text, at));
            }
            state[cur] = 1;
            walk.push(cur);
            match parent[cur] {
                Some((p, _)) => cur = p,
                None => break,
            }
        }
        for w in walk {
            state[w] = 2;
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn err(text: &str) -> TopologyError {
        parse(text).unwrap_err()
    }

    #[test]
    fn tokens_have_positions() {
        let (toks, end) = tokenize("a:0 =>\n  b.c:1 ;").unwrap();
        assert_eq!(toks.len(), 4);
        assert_eq!(toks[0].1, Pos { line: 1, column: 1 });
        assert_eq!(toks[1], (Tok::Arrow, Pos { line: 1, column: 5 }));
        assert_eq!(toks[2].1, Pos { line: 2, column: 3 });
        assert_eq!(toks[3], (Tok::Semi, Pos { line: 2, column: 9 }));
        assert_eq!(end, Pos { line: 2, column: 10 });
    }

    #[test]
    fn arrow_without_spaces() {
        let t = parse("a:0=>a:1;").unwrap();
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn cycle_text_names_the_loop() {
        match err("r:0 => x:1 ; a:1 => b:1 ; b:1 => c:1 ; c:1 => a:1 ;") {
            TopologyError::Cycle { line, column, path } => {
                assert_eq!((line, column), (1, 47));
                assert_eq!(path, "c:1 => a:1 => b:1 => c:1");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn a_long_cycle_is_named_by_its_first_nodes_and_its_length() {
        let mut text = String::from("r:0 => x:0 ;");
        let n = 50_000;
        for i in 0..n {
            text.push_str(&format!(" n{i}:0 => n{}:0 ;", (i + 1) % n));
        }
        match err(&text) {
            TopologyError::Cycle { path, .. } => {
                assert!(path.len() < 200, "{path}");
                assert!(path.ends_with(&format!("({n} nodes in the cycle)")), "{path}");
                assert_eq!(path.matches(" => ").count(), CYCLE_SHOWN + 1, "{path}");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn two_node_cycle_is_no_root() {
        match err("a:0 => b:0 ;\nb:0 => a:0 ;") {
            TopologyError::NoRoot { line, column, path } => {
                assert_eq!((line, column), (1, 1));
                assert!(path.contains("a:0") && path.contains("b:0"), "{path}");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn interner_keeps_first_number() {
        let mut i = Interner::default();
        let p = Pos { line: 1, column: 1 };
        assert_eq!(i.intern("a".into(), 1, p).unwrap(), 0);
        assert_eq!(i.intern("b".into(), 1, p).unwrap(), 1);
        assert_eq!(i.intern("a".into(), 1, p).unwrap(), 0);
        assert_eq!(i.name(1), "b:1");
    }
}
