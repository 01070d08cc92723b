//! The topology layer of treecast: which processes form the tree and how they connect.
//!
//! * [`Topology`]: a validated tree stored in depth-first pre-order. The root (id 0) is
//!   the front-end, interior nodes are comm nodes, leaves are back-ends. Back-end ranks
//!   `0..N` and node ids both follow the pre-order, so every sub-tree owns a contiguous
//!   range of ids ([`Topology::subtree_len`]) and of ranks ([`Topology::first_rank`],
//!   [`Topology::subtree_backends`]); [`Topology::subtree`] cuts one out for the node
//!   that will launch it.
//! * [`TopoNode`]: one process, `host:index`, with its parent and children.
//! * [`Topology::parse`] and [`Topology::to_mrnet`]: MRNet's text format,
//!   `host:index => child:index child:index ;`. Host names are kept whole, dots included,
//!   and may carry the user ssh logs in as (`user@host:index`).
//! * [`Shape`] and [`Topology::generate`]: `flat`, `kary:K`, `knomial:K`,
//!   `balanced:AxBxC` and `fanout:F` trees; [`Topology::from_spec`] takes either such a
//!   spec or a file path, as a command line would.
//! * [`hostlist`]: host lists as cluster users type them (`node[01-16,20],login1`,
//!   `n[1-9/2] -n5`, `^FILE`), [`hostlist::HostList`], [`hostlist::expand`] and
//!   [`hostlist::compress`]; [`Topology::from_hosts`] and
//!   [`Topology::from_hosts_spec`] build a tree over those hosts with a given fan-out
//!   and number of back-ends per host, comm nodes placed on the hosts themselves.
//! * [`TopologyError`]: one enum for every failure; errors from text name the line and
//!   column of the offending token.
//!
//! No function here does I/O except [`Topology::from_spec`] reading a topology file and
//! host lists reading `^FILE`s. Trees are
//! limited to [`MAX_NODES`] nodes. The format is written down in
//! `docs/topology-format.md`.
//!
//! ```
//! use treecast_topology::{Shape, Topology};
//!
//! let t = Topology::parse("fe:0 => n1.example.org:0 n2.example.org:0 ;\n\
//!                          n1.example.org:0 => n1.example.org:1 n1.example.org:2 ;")?;
//! assert_eq!(t.backends(), 3);
//! assert_eq!(t.node(1).host, "n1.example.org");
//! assert_eq!(t.backend_rank(4), Some(2));
//!
//! let k = Topology::generate(&"kary:8".parse::<Shape>()?, Some(64), "localhost")?;
//! assert_eq!((k.comm_nodes(), k.depth()), (8, 2));
//! # Ok::<(), treecast_topology::TopologyError>(())
//! ```

mod error;
mod generate;
pub mod hostlist;
mod hostname;
mod parse;
mod render;
mod topology;

pub use error::TopologyError;
pub use generate::{Shape, DEFAULT_HOST, MAX_TOPOLOGY_FILE_BYTES};
pub use topology::{TopoNode, Topology, MAX_NODES};
