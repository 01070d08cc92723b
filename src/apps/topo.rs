//! `treecast topo`: print or check a topology.

use std::process::ExitCode;

use treecast_topology::Topology;

use super::cli::{TopoArgs, TopoFormat};

/// Prints the tree the spec describes, or the error naming what is wrong.
pub fn main(args: TopoArgs) -> anyhow::Result<ExitCode> {
    let topo = Topology::from_spec(&args.spec, args.backends)?;
    match args.format {
        TopoFormat::Tree => print!("{}", ensure_newline(topo.render())),
        TopoFormat::Mrnet => print!("{}", ensure_newline(topo.to_mrnet())),
    }
    Ok(ExitCode::SUCCESS)
}

fn ensure_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}
