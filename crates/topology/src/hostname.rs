//! What a host name may be, in one place: the characters and first letters that
//! topology files, generators and host lists accept (so that ssh or srun can never
//! take a name for an option), and `user@host` taken apart.

/// Whether a character may appear in a host name.
pub(crate) fn host_char_ok(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

/// What is wrong with a written host name (`host` or `user@host`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameFault {
    /// A character no host or user name may hold.
    Char(char),
    /// The host starts with something other than a letter or a digit, or the user with
    /// something other than a letter, a digit or `_`.
    Start(char),
    /// `@host`: nothing before the `@`.
    EmptyUser,
    /// `user@`, or nothing at all.
    EmptyHost,
}

impl NameFault {
    /// Says what is wrong, for error messages.
    pub(crate) fn reason(self) -> String {
        match self {
            NameFault::Char(c) => {
                format!("`{c}` cannot be part of a host name (letters, digits, `.`, `-` and `_`)")
            }
            NameFault::Start(c) => format!(
                "a host name starts with a letter or a digit, not `{c}`, so that ssh or srun can never \
                 take it for an option"
            ),
            NameFault::EmptyUser => "nothing before `@`: write `user@host`".to_string(),
            NameFault::EmptyHost => "no host name after `@`: write `user@host`".to_string(),
        }
    }
}

/// Checks a host name as topology files and generators take it: `host` or `user@host`,
/// each part of letters, digits, `.`, `-` and `_`, the host starting with a letter or a
/// digit as MRNet's lexer wants (a user may also start with `_`). A name can thus never
/// start with `-`. On failure, returns the 0-based offset (in characters) of the fault.
pub(crate) fn check_name(name: &str) -> Result<(), (usize, NameFault)> {
    let (user, host, skip) = match name.split_once('@') {
        Some((user, host)) => (Some(user), host, user.chars().count() + 1),
        None => (None, name, 0),
    };
    if let Some(user) = user {
        check_part(user, 0, true)?;
    }
    check_part(host, skip, false)
}

/// Checks the user (`is_user`) or host part of a name, which starts at `offset`.
fn check_part(part: &str, offset: usize, is_user: bool) -> Result<(), (usize, NameFault)> {
    if let Some((k, c)) = part.chars().enumerate().find(|&(_, c)| !host_char_ok(c)) {
        return Err((offset + k, NameFault::Char(c)));
    }
    match part.chars().next() {
        None if is_user => Err((offset, NameFault::EmptyUser)),
        None => Err((offset, NameFault::EmptyHost)),
        Some(c) if c.is_ascii_alphanumeric() || (is_user && c == '_') => Ok(()),
        Some(c) => Err((offset, NameFault::Start(c))),
    }
}

/// Splits `user@host` into the ssh login user and the host; the user is `None` when
/// there is no `@`.
pub fn split_user(name: &str) -> (Option<&str>, &str) {
    match name.split_once('@') {
        Some((user, host)) => (Some(user), host),
        None => (None, name),
    }
}

/// The host of `user@host` (or of a plain host): what names the machine when hosts are
/// grouped, compared with this host or shown to people.
pub fn bare_host(name: &str) -> &str {
    split_user(name).1
}
