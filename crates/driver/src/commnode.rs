//! `treecast node`: a comm node's whole life, and what every process needs to join
//! its parent.

use std::time::Duration;

use treecast_filters::FilterRegistry;
use treecast_launch::LauncherRegistry;
use treecast_transport::Secret;
use treecast_wire::{Window, MAX_PAYLOAD_LEN};

use crate::driver::node_route::NodeRoute;
use crate::driver::{drive, Driver, Launching, NoTool, Tool};
use crate::join::{connect_to, parse_striped};
use crate::{env, NodeError};
use treecast_proto::{Node, NodeConfig, Peer, Role};

/// How long a new node may take to reach its parent.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);
/// Largest frame payload accepted unless the plan says otherwise: the largest file
/// chunk (64 MiB) and its header.
pub const DEFAULT_MAX_FRAME: usize = (64 << 20) + (64 << 10);

fn env_var(var: &'static str) -> Result<String, NodeError> {
    std::env::var(var).map_err(|_| NodeError::Env { var, reason: "not set".into() })
}

fn env_parse<T: std::str::FromStr>(var: &'static str) -> Result<T, NodeError>
where
    T::Err: std::fmt::Display,
{
    env_var(var)?.parse().map_err(|e: T::Err| NodeError::Env { var, reason: e.to_string() })
}

/// The session secret: from the environment (a local parent puts it there), or
/// from standard input (ssh brings it there).
///
/// The variable is taken out of the environment once read, also from the block that
/// `/proc/PID/environ` shows, so the commands this process runs cannot read it there.
///
/// # Errors
/// Neither holds a valid secret.
pub fn read_secret() -> Result<Secret, NodeError> {
    match Secret::from_env() {
        Ok(secret) => {
            treecast_launch::clear_env_var(treecast_transport::SECRET_ENV);
            Ok(secret)
        }
        Err(env_err) => match treecast_launch::secret_from_stdin() {
            Some(line) => {
                let line = line.map_err(|source| NodeError::Io {
                    what: "reading the secret from stdin".into(),
                    source,
                })?;
                Ok(Secret::from_hex(&line)?)
            }
            None => Err(env_err.into()),
        },
    }
}

/// Loads a plug-in filter (named by the plan, or shipped down the tree) into `registry`.
fn load_plugin(
    source: treecast_proto::PluginSource<'_>,
    registry: &mut FilterRegistry,
) -> Result<(), String> {
    use sha2::Digest;
    use treecast_plugin::Plugin;
    let plugin = match source {
        treecast_proto::PluginSource::Path(path) => Plugin::load(path),
        treecast_proto::PluginSource::Bytes { label, sha256, bytes } => {
            let found: [u8; 32] = sha2::Sha256::digest(bytes).into();
            if found != *sha256 {
                return Err(format!(
                    "its {} bytes do not have the SHA-256 the front-end sent; send it again",
                    bytes.len()
                ));
            }
            Plugin::load_bytes(bytes, label)
        }
    };
    plugin.map(|p| p.register(registry)).map_err(|e| e.to_string())
}

/// Runs a comm node with the built-in filters, starting its children on this host
/// with this program: connect to the parent named in the environment, then drive
/// the node until its parent goes away or shuts the tree down.
///
/// # Errors
/// Failures before the node is linked to its parent (after that, failures are
/// reported to the parent).
pub async fn run_comm_node() -> Result<(), NodeError> {
    run_comm_node_with(FilterRegistry::builtin()).await
}

/// Runs a comm node that can make the filters of `registry` (a tool serving as its
/// own comm node registers its filters there), as [`run_comm_node`] does.
///
/// # Errors
/// As [`run_comm_node`].
pub async fn run_comm_node_with(registry: FilterRegistry) -> Result<(), NodeError> {
    run_comm_node_with_launchers(registry, LauncherRegistry::builtin()).await
}

/// As [`run_comm_node_with`], starting its children with the launcher its plan
/// names from `launchers`: a tool that registered a launcher of its own for its
/// front-end (`NetworkBuilder::launchers`) registers it here too, since every comm
/// node starts its own children.
///
/// # Errors
/// As [`run_comm_node`].
pub async fn run_comm_node_with_launchers(
    filters: FilterRegistry,
    launchers: LauncherRegistry,
) -> Result<(), NodeError> {
    let me = std::env::current_exe()
        .map_err(|source| NodeError::Io { what: "finding this program's own path".into(), source })?;
    run_comm_node_as(filters, launchers, me).await
}

/// As [`run_comm_node_with_launchers`], starting the children on this host with `program`
/// (as `<program> node` and `<program> backend`): the `treecast` command passes
/// `TREECAST_PATH` here, so that a wrapper (a profiler, a debugger) stands in at
/// every level.
///
/// # Errors
/// As [`run_comm_node`].
pub async fn run_comm_node_as(
    registry: FilterRegistry,
    launchers: LauncherRegistry,
    program: std::path::PathBuf,
) -> Result<(), NodeError> {
    let parent: String = env_var(env::PARENT)?;
    let node_id: u32 = env_parse(env::NODE_ID)?;
    let secret = read_secret()?;
    let mut core = Node::new(NodeConfig {
        role: Role::CommNode,
        node_id,
        name: format!("comm node (node {node_id})"),
        registry,
        tool_window: Window { packets: 1, bytes: 1 },
    });
    core.set_plugin_loader(std::sync::Arc::new(load_plugin));
    core.set_parent_address(parent.clone());
    let launching = Launching::new(secret, program).with_launchers(launchers);
    let driver =
        join_parent(&parent, core, NoTool, launching, DEFAULT_MAX_FRAME.min(MAX_PAYLOAD_LEN)).await?;
    drive(std::sync::Arc::new(std::sync::Mutex::new(driver))).await;
    Ok(())
}

/// Links `core` (a comm node or a back-end, not yet started) to its parent at
/// `parent`: connects, authenticates as the core's node with the secret in
/// `launching`, and hands back its driver with the parent link in place. The
/// schedule's settings come later, with the plan.
///
/// # Errors
/// The parent cannot be reached or refuses the handshake, or the link cannot be
/// registered with the reactor.
pub async fn join_parent<T: Tool>(
    parent: &str,
    mut core: Node,
    tool: T,
    launching: Launching,
    max_frame: usize,
) -> Result<Driver<T, NodeRoute>, NodeError> {
    let io = |what: &'static str| move |source| NodeError::Io { what: what.into(), source };
    let sockets = match parse_striped(parent)? {
        Some((count, addrs)) => {
            treecast_transport::striped::connect(
                &addrs,
                count,
                core.node_id(),
                &launching.secret,
                CONNECT_LIMIT,
            )
            .await?
        }
        None => {
            let stream = connect_to(parent, core.node_id(), &launching.secret, CONNECT_LIMIT).await?;
            vec![stream.into_socket().map_err(io("taking over the parent link"))?]
        }
    };
    core.set_clock(env::system_clock(), treecast_proto::ClockConfig::default());
    let mut driver = Driver::new(core, tool, launching, max_frame);
    driver
        .add_links(sockets, Peer::Parent, format!("parent {parent}"))
        .map_err(io("registering the parent link"))?;
    Ok(driver)
}
