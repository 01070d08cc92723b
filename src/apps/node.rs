//! `treecast node`: a comm node.

use std::process::ExitCode;

use treecast_filters::FilterRegistry;

/// Runs a comm node until its parent goes away. Its children on this host run the
/// program `TREECAST_PATH` names (a wrapper standing in for `treecast` at every
/// level), else this one.
pub async fn main() -> anyhow::Result<ExitCode> {
    let program = match std::env::var_os(super::settings::TREECAST_PATH).filter(|p| !p.is_empty()) {
        Some(path) => path.into(),
        None => std::env::current_exe()?,
    };
    treecast_driver::run_comm_node_as(FilterRegistry::builtin(), program).await?;
    Ok(ExitCode::SUCCESS)
}
