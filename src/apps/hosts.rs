//! `treecast hosts`: what a host list means, before running on it (like ClusterShell's
//! `nodeset`).

use std::io::Write;
use std::process::ExitCode;

use treecast_topology::hostlist::{compress, HostList};

use super::cli::HostsArgs;

/// How `treecast hosts` prints a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Every host, separated by spaces.
    Expand,
    /// Folded into ranges.
    Fold,
    /// The number of hosts.
    Count,
}

/// Reads the lists, prints the warnings on stderr and the hosts on stdout.
///
/// # Errors
/// A list that cannot be read, or stdout closed.
pub fn main(args: HostsArgs) -> anyhow::Result<ExitCode> {
    let include: Vec<&str> = args.exprs.iter().map(String::as_str).collect();
    let exclude: Vec<&str> = args.exclude.iter().map(String::as_str).collect();
    let list = HostList::new(&include, &exclude)?;
    for warning in &list.warnings {
        eprintln!("treecast: warning: {warning}");
    }
    let output = match (args.expand, args.count) {
        (true, _) => Output::Expand,
        (_, true) => Output::Count,
        _ => Output::Fold,
    };
    let mut text = render(&list.hosts, output);
    text.push('\n');
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// The hosts as `treecast hosts` prints them, without the final newline.
pub fn render(hosts: &[String], output: Output) -> String {
    match output {
        Output::Expand => hosts.join(" "),
        Output::Fold => compress(hosts),
        Output::Count => hosts.len().to_string(),
    }
}
