//! What the command line offers: one module per subcommand.

pub mod backend;
pub mod bcast;
pub mod bcastbench;
pub mod bench;
pub mod chaos;
pub mod cli;
pub mod clock;
pub mod clocksim;
pub mod collbench;
pub mod demo;
pub mod guard;
pub mod hosts;
pub mod joincost;
pub mod monitor;
pub mod node;
pub mod protocol;
pub mod routebench;
pub mod routelive;
pub mod run;
pub mod simbench;
pub mod spawnbench;
pub mod topo;
