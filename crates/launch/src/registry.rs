//! Launchers by name: a node builds the launcher its plan names once, as filters
//! are made from their names.

use std::sync::Arc;

use treecast_wire::{LauncherKind, LauncherSpec};

use crate::{LaunchError, Launcher, LocalLauncher, SrunOptions, SshOptions};

/// Makes a launcher from the options a launch plan carries.
pub type MakeLauncher = fn(&LauncherSpec) -> Result<Arc<dyn Launcher>, LaunchError>;

/// The launchers a node can build, by name (`local`, `ssh`, `slurm`).
#[derive(Debug, Clone)]
pub struct LauncherRegistry {
    makers: Vec<(&'static str, MakeLauncher)>,
}

impl Default for LauncherRegistry {
    fn default() -> Self {
        LauncherRegistry::builtin()
    }
}

impl LauncherRegistry {
    /// The launchers treecast ships: fork/exec, the system ssh, Slurm job steps.
    pub fn builtin() -> LauncherRegistry {
        let mut registry = LauncherRegistry { makers: Vec::new() };
        registry.register("local", |_| Ok(Arc::new(LocalLauncher)));
        registry.register("ssh", |spec| {
            Ok(Arc::new(SshOptions {
                program: spec.program.clone(),
                args: spec.args.clone(),
                connect_timeout: spec.connect_timeout_s,
                remote_path: spec.remote_path.clone(),
                remote_prefix: spec.remote_prefix.clone(),
            }))
        });
        registry.register("slurm", |spec| {
            Ok(Arc::new(SrunOptions {
                program: spec.program.clone(),
                args: spec.args.clone(),
                remote_path: spec.remote_path.clone(),
            }))
        });
        registry
    }

    /// Adds (or replaces) the launcher called `name`.
    pub fn register(&mut self, name: &'static str, make: MakeLauncher) {
        self.makers.retain(|(n, _)| *n != name);
        self.makers.push((name, make));
    }

    /// The launcher `spec` names.
    ///
    /// # Errors
    /// [`LaunchError::Unknown`] when no launcher of that name is registered, or the
    /// launcher's own error for options it refuses.
    pub fn make(&self, spec: &LauncherSpec) -> Result<Arc<dyn Launcher>, LaunchError> {
        let name = kind_name(spec.kind);
        match self.makers.iter().find(|(n, _)| *n == name) {
            Some((_, make)) => make(spec),
            None => Err(LaunchError::Unknown {
                name: name.to_owned(),
                known: self.makers.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            }),
        }
    }
}

/// The name a plan's launcher kind is registered under.
fn kind_name(kind: LauncherKind) -> &'static str {
    match kind {
        LauncherKind::Local => "local",
        LauncherKind::Ssh => "ssh",
        LauncherKind::Slurm => "slurm",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(kind: LauncherKind) -> LauncherSpec {
        LauncherSpec {
            kind,
            program: "prog".into(),
            args: vec!["-x".into()],
            connect_timeout_s: 5,
            remote_path: "/opt/treecast".into(),
            remote_prefix: String::new(),
        }
    }

    #[test]
    fn each_builtin_kind_makes_its_launcher_with_the_plans_options() {
        let registry = LauncherRegistry::builtin();
        let local = registry.make(&spec(LauncherKind::Local)).unwrap();
        assert_eq!(
            (local.kind(), local.reaches_other_hosts(), local.takes_local_hosts()),
            ("local", false, false)
        );
        let ssh = registry.make(&spec(LauncherKind::Ssh)).unwrap();
        assert_eq!(
            (ssh.kind(), ssh.reaches_other_hosts(), ssh.remote_path()),
            ("ssh", true, "/opt/treecast")
        );
        let slurm = registry.make(&spec(LauncherKind::Slurm)).unwrap();
        assert_eq!((slurm.kind(), slurm.takes_local_hosts()), ("slurm", true));
    }

    #[test]
    fn a_registered_launcher_replaces_the_builtin_and_a_missing_one_is_named() {
        let mut registry = LauncherRegistry::builtin();
        registry.register("ssh", |_| Ok(Arc::new(LocalLauncher)));
        assert_eq!(registry.make(&spec(LauncherKind::Ssh)).unwrap().kind(), "local");
        let empty = LauncherRegistry { makers: Vec::new() };
        let e = empty.make(&spec(LauncherKind::Slurm)).unwrap_err().to_string();
        assert!(e.contains("slurm") && e.contains("no launcher"), "{e}");
    }
}
