//! `treecast node`: a comm node.

use std::process::ExitCode;

use treecast_filters::FilterRegistry;
use treecast_launch::LauncherRegistry;

/// Runs a comm node until its parent goes away. Its children on this host run the
/// program `TREECAST_PATH` names (a wrapper standing in for `treecast` at every
/// level), else this one.
pub async fn main() -> anyhow::Result<ExitCode> {
    let program = match std::env::var_os(super::settings::TREECAST_PATH) {
        Some(path) if path.is_empty() => anyhow::bail!(
            "{} is set but empty: name the program comm nodes run, or unset it",
            super::settings::TREECAST_PATH
        ),
        Some(path) => path.into(),
        None => std::env::current_exe()?,
    };
    treecast_driver::run_comm_node_as(FilterRegistry::builtin(), LauncherRegistry::builtin(), program)
        .await?;
    Ok(ExitCode::SUCCESS)
}
