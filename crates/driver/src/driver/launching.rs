//! What a node needs to start children: the secret, its own binary, the launchers.

use treecast_transport::Secret;

/// What the driver needs to start children.
#[derive(Debug, Clone)]
pub struct Launching {
    /// The session secret children authenticate with.
    pub secret: Secret,
    /// The `treecast` binary comm nodes (and generic back-ends) run on this host.
    pub treecast_exe: std::path::PathBuf,
    /// The launchers the plan may name; the node builds the one it names once.
    pub launchers: treecast_launch::LauncherRegistry,
}

impl Launching {
    /// What a node needs to start children with the built-in launchers.
    pub fn new(secret: Secret, treecast_exe: std::path::PathBuf) -> Launching {
        Launching { secret, treecast_exe, launchers: treecast_launch::LauncherRegistry::builtin() }
    }

    /// The same, making the launcher the plan names from `launchers` (a tool's own
    /// launchers registered beside, or instead of, the built-ins).
    pub fn with_launchers(mut self, launchers: treecast_launch::LauncherRegistry) -> Launching {
        self.launchers = launchers;
        self
    }
}
