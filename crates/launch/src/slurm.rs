//! Starting processes as Slurm job steps with `srun`, inside an allocation.
//!
//! Every process becomes a step of the job, so Slurm places, accounts for and
//! cleans up after it. The environment (secret included) reaches the step through
//! srun's default `--export=ALL`, never through the command line. Steps use
//! `--overlap` so that dozens of single-task steps run at once in one allocation.

use std::net::IpAddr;
use std::process::Stdio;

use tokio::process::Command;

use crate::{spawn, LaunchError, Launched, Launcher, ProcessSpec};

/// Environment variable holding extra srun arguments (split on white space).
pub const SRUN_ARGS_ENV: &str = "TREECAST_SRUN_ARGS";

/// How to start job steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrunOptions {
    /// The srun program (default `srun`).
    pub program: String,
    /// Extra arguments, e.g. `--partition=debug`.
    pub args: Vec<String>,
    /// Path of `treecast` on the nodes (default: this binary's path; Slurm clusters share file systems).
    pub remote_path: String,
}

impl SrunOptions {
    /// Options with extra arguments `text`, the value of `TREECAST_SRUN_ARGS` the
    /// `treecast` command read (split as a shell would; `None`: none), running
    /// `remote_path` on the nodes.
    ///
    /// # Errors
    /// The quotes do not balance (the error names the variable).
    pub fn with_args(remote_path: String, text: Option<&str>) -> Result<Self, crate::ArgsError> {
        let args = match text {
            Some(text) => crate::split_args(text).map_err(|e| e.from(SRUN_ARGS_ENV))?,
            None => Vec::new(),
        };
        Ok(SrunOptions { program: "srun".into(), args, remote_path })
    }
}

impl Launcher for SrunOptions {
    fn kind(&self) -> &'static str {
        "slurm"
    }

    fn takes_local_hosts(&self) -> bool {
        true
    }

    fn remote_path(&self) -> &str {
        &self.remote_path
    }

    /// Starts `spec` as a one-task job step on `spec.host`.
    fn launch(&self, spec: &ProcessSpec) -> Result<Launched, LaunchError> {
        let cmd = self.command(spec)?;
        spawn(cmd, spec, &self.program)
    }
}

impl SrunOptions {
    /// The srun command line for `spec`. The host travels inside one argument,
    /// `--nodelist=HOST`, so srun cannot read it as an option of its own; it is checked
    /// with [`host_problem`](crate::host_problem) all the same.
    ///
    /// # Errors
    /// [`LaunchError::BadHost`] for a host srun could take for an option, or a
    /// `user@host`: every step runs as the job's user.
    fn command(&self, spec: &ProcessSpec) -> Result<Command, LaunchError> {
        let bad = |reason: &str| LaunchError::BadHost {
            name: spec.name.clone(),
            host: spec.host.clone(),
            reason: reason.to_owned(),
        };
        if let Some(reason) = crate::host_problem(&spec.host) {
            return Err(bad(reason));
        }
        if spec.host.contains('@') {
            return Err(bad(
                "srun runs every step as the job's user, so `user@` cannot be honoured; drop it",
            ));
        }
        let mut cmd = Command::new(&self.program);
        cmd.args(["-N1", "-n1", "--overlap", "--quiet", "--kill-on-bad-exit=1"])
            .arg(format!("--nodelist={}", spec.host))
            .arg(format!("--job-name=treecast:{}", spec.name.replace(' ', "_")))
            .args(&self.args)
            .arg("--")
            .arg(&spec.program)
            .args(&spec.args)
            .env_remove(crate::SECRET_STDIN_ENV)
            .envs(spec.env.iter().chain(spec.secret.iter()).map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::inherit());
        Ok(cmd)
    }
}

/// The local end of the route to `host`, resolved by the system resolver.
///
/// # Errors
/// [`RouteError`] when the host does not resolve or no route leads to it.
pub(crate) async fn local_address_towards(host: &str) -> Result<IpAddr, RouteError> {
    let addr = tokio::net::lookup_host((host, 22))
        .await
        .map_err(|source| RouteError::Resolve { host: host.to_owned(), source })?
        .next()
        .ok_or_else(|| RouteError::NoAddress { host: host.to_owned() })?;
    // Connecting a UDP socket sends nothing; it only asks the kernel for a route.
    let unspecified: IpAddr = if addr.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() };
    let no_route = |source| RouteError::NoRoute { host: host.to_owned(), addr, source };
    let probe = std::net::UdpSocket::bind((unspecified, 0)).map_err(no_route)?;
    probe.connect(addr).map_err(no_route)?;
    probe.local_addr().map(|a| a.ip()).map_err(no_route)
}

/// Why this host's address towards another host could not be found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The name did not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        /// The host.
        host: String,
        /// What the resolver said.
        #[source]
        source: std::io::Error,
    },
    /// The name resolved to nothing.
    #[error("{host} has no address")]
    NoAddress {
        /// The host.
        host: String,
    },
    /// The kernel has no route to it.
    #[error("no route to {host} ({addr}): {source}")]
    NoRoute {
        /// The host.
        host: String,
        /// Its address.
        addr: std::net::SocketAddr,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// A host that ssh could take for an option; ssh was not run.
    #[error("refusing to look up `{host}`: {reason}")]
    BadHost {
        /// The host as given.
        host: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `ssh -G` could not be run to learn the real host name.
    #[error("running {program} -G {host}: {source}")]
    SshConfig {
        /// The ssh program.
        program: String,
        /// The host.
        host: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(host: &str) -> ProcessSpec {
        ProcessSpec {
            name: "back-end rank 0".into(),
            host: host.into(),
            program: "/opt/treecast".into(),
            args: vec!["backend".into()],
            env: vec![],
            secret: None,
            forward_stderr: false,
            die_with_parent: true,
        }
    }

    #[test]
    fn the_host_reaches_srun_inside_one_argument() {
        let srun = SrunOptions {
            program: "srun".into(),
            args: vec!["-p".into(), "debug".into()],
            remote_path: String::new(),
        };
        let cmd = srun.command(&spec("n1")).unwrap();
        let argv: Vec<String> = cmd.as_std().get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            argv,
            [
                "-N1",
                "-n1",
                "--overlap",
                "--quiet",
                "--kill-on-bad-exit=1",
                "--nodelist=n1",
                "--job-name=treecast:back-end_rank_0",
                "-p",
                "debug",
                "--",
                "/opt/treecast",
                "backend"
            ]
        );
        for host in ["-w", "--uid=0", "bob@n1", "", "n 1"] {
            let e = srun.command(&spec(host)).unwrap_err();
            assert!(matches!(e, LaunchError::BadHost { .. }), "{host}: {e}");
        }
    }

    #[tokio::test]
    async fn loopback_routes_to_itself() {
        assert_eq!(local_address_towards("localhost").await.unwrap().to_string(), "127.0.0.1");
    }
}
