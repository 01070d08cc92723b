//! Launchers by name: a node builds the launcher its plan names once, as filters
//! are made from their names. A new launcher (Flux, PBS, a container runtime) is
//! one type implementing [`Launcher`] and one [`LauncherRegistry::register`] call in
//! every program that starts children (the front-end's `NetworkBuilder::launchers`,
//! a tool's own comm node); the plan carries its name and options as they are.

use std::sync::Arc;

use treecast_wire::{LauncherSpec, LOCAL_LAUNCHER, MAX_LAUNCHER_NAME, SLURM_LAUNCHER, SSH_LAUNCHER};

use crate::{LaunchError, Launcher, LocalLauncher, SrunOptions, SshOptions};

/// Makes a launcher from the options a launch plan carries. A plain function: the
/// launcher takes all it needs from the plan's [`LauncherSpec`] (program, arguments,
/// time limits), which every comm node receives, and captures nothing of the tool's
/// process.
pub type MakeLauncher = fn(&LauncherSpec) -> Result<Arc<dyn Launcher>, LaunchError>;

/// The launchers a node can build, by name (`local`, `ssh`, `slurm`).
#[derive(Debug, Clone)]
pub struct LauncherRegistry {
    makers: Vec<(String, MakeLauncher)>,
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
        registry.register(LOCAL_LAUNCHER, |_| Ok(Arc::new(LocalLauncher)));
        registry.register(SSH_LAUNCHER, |spec| {
            Ok(Arc::new(SshOptions {
                program: spec.program.clone(),
                args: spec.args.clone(),
                connect_timeout: spec.connect_timeout_s,
                remote_path: spec.remote_path.clone(),
                remote_prefix: spec.remote_prefix.clone(),
            }))
        });
        registry.register(SLURM_LAUNCHER, |spec| {
            Ok(Arc::new(SrunOptions {
                program: spec.program.clone(),
                args: spec.args.clone(),
                remote_path: spec.remote_path.clone(),
            }))
        });
        registry
    }

    /// Adds (or replaces) the launcher called `name`: a plan whose
    /// [`LauncherSpec::name`] is `name` makes its launcher with `make`.
    pub fn register(&mut self, name: impl Into<String>, make: MakeLauncher) {
        let name = name.into();
        self.makers.retain(|(n, _)| *n != name);
        self.makers.push((name, make));
    }

    /// The names registered, in the order they were.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.makers.iter().map(|(n, _)| n.as_str())
    }

    /// The launcher `spec` names.
    ///
    /// # Errors
    /// [`LaunchError::BadName`] for a name the plan cannot carry (empty, or over
    /// [`MAX_LAUNCHER_NAME`] bytes: refused here, at the front-end, before comm nodes
    /// would refuse the plan), [`LaunchError::Unknown`] when no launcher of that name
    /// is registered, or the launcher's own error for options it refuses.
    pub fn make(&self, spec: &LauncherSpec) -> Result<Arc<dyn Launcher>, LaunchError> {
        let len = spec.name.len();
        if len == 0 || len > MAX_LAUNCHER_NAME {
            return Err(LaunchError::BadName { name: spec.name.clone(), len, max: MAX_LAUNCHER_NAME });
        }
        match self.makers.iter().find(|(n, _)| *n == spec.name) {
            Some((_, make)) => make(spec),
            None => Err(LaunchError::Unknown {
                name: spec.name.clone(),
                known: self.names().collect::<Vec<_>>().join(", "),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(name: &str) -> LauncherSpec {
        LauncherSpec {
            name: name.into(),
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
        let local = registry.make(&spec("local")).unwrap();
        assert_eq!(
            (local.kind(), local.reaches_other_hosts(), local.takes_local_hosts()),
            ("local", false, false)
        );
        let ssh = registry.make(&spec("ssh")).unwrap();
        assert_eq!(
            (ssh.kind(), ssh.reaches_other_hosts(), ssh.remote_path()),
            ("ssh", true, "/opt/treecast")
        );
        let slurm = registry.make(&spec("slurm")).unwrap();
        assert_eq!((slurm.kind(), slurm.takes_local_hosts()), ("slurm", true));
    }

    #[test]
    fn a_registered_launcher_replaces_the_builtin_and_a_missing_one_is_named() {
        let mut registry = LauncherRegistry::builtin();
        registry.register("ssh", |_| Ok(Arc::new(LocalLauncher)));
        assert_eq!(registry.make(&spec("ssh")).unwrap().kind(), "local");
        let empty = LauncherRegistry { makers: Vec::new() };
        let e = empty.make(&spec("slurm")).unwrap_err().to_string();
        assert!(e.contains("slurm") && e.contains("no launcher"), "{e}");
        // A name no build knows is no decoding matter: the registry names what it has.
        let e = registry.make(&spec("flux")).unwrap_err().to_string();
        assert!(e.contains("`flux`") && e.contains("local, slurm, ssh"), "{e}");
        // A name the plan cannot carry is refused when made, at the front-end.
        let long = "x".repeat(MAX_LAUNCHER_NAME + 1);
        registry.register(long.clone(), |_| Ok(Arc::new(LocalLauncher)));
        let e = registry.make(&spec(&long)).unwrap_err().to_string();
        assert!(e.contains("1 to 64 bytes") && e.contains("is 65"), "{e}");
        registry.register("", |_| Ok(Arc::new(LocalLauncher)));
        assert!(matches!(registry.make(&spec("")), Err(LaunchError::BadName { len: 0, .. })));
    }

    #[test]
    fn a_new_launcher_is_one_type_and_one_registration() {
        #[derive(Debug)]
        struct Pbs(String);
        impl Launcher for Pbs {
            fn launch(&self, _spec: &crate::ProcessSpec) -> Result<crate::Launched, LaunchError> {
                Err(LaunchError::Unknown { name: "not in a unit test".into(), known: String::new() })
            }
            fn kind(&self) -> &'static str {
                "pbs"
            }
            fn remote_path(&self) -> &str {
                &self.0
            }
        }
        let mut registry = LauncherRegistry::builtin();
        registry.register("pbs", |spec| Ok(Arc::new(Pbs(spec.remote_path.clone()))));
        let pbs = registry.make(&spec("pbs")).unwrap();
        assert_eq!((pbs.kind(), pbs.remote_path()), ("pbs", "/opt/treecast"));
        assert_eq!(registry.names().collect::<Vec<_>>(), ["local", "ssh", "slurm", "pbs"]);
    }
}
