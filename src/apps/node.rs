//! `treecast node`: a comm node.

use std::process::ExitCode;

/// Runs a comm node until its parent goes away.
pub async fn main() -> anyhow::Result<ExitCode> {
    treecast_driver::run_comm_node().await?;
    Ok(ExitCode::SUCCESS)
}
