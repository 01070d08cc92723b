//! `treecast bench`: benchmarks that print their figures and the ratio to a
//! reference measured in the same run, a module each (`microbench` also holds
//! `bench run` and the raw processes it measures as its floor); what several of
//! them use is in `shared`.

use std::process::ExitCode;

use super::cli::{BenchArgs, BenchCommand};

pub mod bcast;
pub mod c_twin;
pub mod chaos;
pub mod collectives;
pub mod costs;
pub mod joincost;
pub mod microbench;
pub mod prefix_tree;
pub mod route;
pub mod route_live;
pub mod route_pair;
pub mod shared;
pub mod sim;
pub mod spawn;

/// Dispatches `treecast bench ...`.
pub async fn main(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Microbench(m) => microbench::microbench(m).await,
        BenchCommand::Run(r) => microbench::bench_run(r).await,
        BenchCommand::Filter(f) => microbench::bench_filter(f).await,
        BenchCommand::PrefixTree(p) => prefix_tree::main(p).await,
        BenchCommand::Sim(s) => sim::main(s),
        BenchCommand::Route(r) => route::main(r).await,
        BenchCommand::Bcast(b) => bcast::main(b).await,
        BenchCommand::Spawn(s) => spawn::spawn_main(s).await,
        BenchCommand::Merge(m) => spawn::merge_main(m).await,
        BenchCommand::Intergroup(i) => spawn::intergroup_main(i).await,
        BenchCommand::Chaos(c) => chaos::main(c).await,
        BenchCommand::Echo => microbench::echo(),
        BenchCommand::Relay => microbench::relay(),
        BenchCommand::Write(w) => bcast::write_floor_worker(&w),
    }
}
