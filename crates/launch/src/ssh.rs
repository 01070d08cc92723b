//! Starting processes on other hosts with the system `ssh`.
//!
//! The user's ssh configuration, agents and jump hosts apply because the real
//! `ssh` binary is used. Configuration travels on the remote command line as
//! environment assignments; the session secret never does: it is written to the
//! remote process's standard input and read there (`TREECAST_SECRET_STDIN=1`).

use std::net::IpAddr;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::{spawn, LaunchError, Launched, Launcher, ProcessSpec};

impl Launcher for SshOptions {
    fn launch(&self, spec: &ProcessSpec) -> Result<Launched, LaunchError> {
        self.start(spec)
    }

    fn kind(&self) -> &'static str {
        "ssh"
    }

    fn remote_path(&self) -> &str {
        &self.remote_path
    }

    fn local_address_towards<'a>(&'a self, host: &'a str) -> crate::AddressLookup<'a> {
        Box::pin(SshOptions::local_address_towards(self, host))
    }
}

/// Environment variable holding extra ssh arguments (split on white space).
pub const SSH_ARGS_ENV: &str = "TREECAST_SSH_ARGS";
/// Set on a remote command whose secret arrives on standard input.
pub const SECRET_STDIN_ENV: &str = "TREECAST_SECRET_STDIN";

/// How to reach other hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshOptions {
    /// The ssh program (default `ssh`).
    pub program: String,
    /// Extra arguments before the host, e.g. `-F cluster_config`.
    pub args: Vec<String>,
    /// Seconds ssh may take to connect.
    pub connect_timeout: u32,
    /// Path of `treecast` on the remote hosts (default: found on the remote `PATH`).
    pub remote_path: String,
    /// Shell text the remote command runs first, as a wrapper that runs the program
    /// (`exec PREFIX env ... PROGRAM`; MRNet's `XPLAT_REMCMD`); empty: none.
    pub remote_prefix: String,
}

impl Default for SshOptions {
    fn default() -> Self {
        SshOptions {
            program: "ssh".into(),
            args: Vec::new(),
            connect_timeout: 10,
            remote_path: "treecast".into(),
            remote_prefix: String::new(),
        }
    }
}

/// Quotes a word for a POSIX shell (the remote command line ssh hands to the remote shell).
pub fn shell_quote(word: &str) -> String {
    match shlex::try_quote(word) {
        Ok(quoted) => quoted.into_owned(),
        // Only a NUL byte is refused; no shell word can hold one, so drop it.
        Err(_) => shell_quote(&word.replace('\0', "")),
    }
}

/// Extra launcher arguments that cannot be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot split {where_}{text:?} into arguments: its quotes do not balance")]
pub struct ArgsError {
    /// Where they came from (`TREECAST_SSH_ARGS: `), empty when unknown.
    pub where_: String,
    /// The text.
    pub text: String,
}

impl ArgsError {
    /// The same error, saying where the text came from.
    pub fn from(mut self, origin: &str) -> ArgsError {
        self.where_ = format!("{origin} ");
        self
    }
}

/// Splits extra launcher arguments as a shell would (`-o 'ProxyCommand=ssh -W %h:%p gw'`
/// is two arguments), so an argument with spaces survives every level of the tree.
///
/// # Errors
/// Unbalanced quotes.
pub fn split_args(text: &str) -> Result<Vec<String>, ArgsError> {
    shlex::split(text).ok_or_else(|| ArgsError { where_: String::new(), text: text.to_owned() })
}

impl SshOptions {
    /// Options with extra arguments `text`, the value of `TREECAST_SSH_ARGS` the
    /// `treecast` command read (split as a shell would; `None`: none).
    ///
    /// # Errors
    /// The quotes do not balance (the error names the variable).
    pub fn with_args(text: Option<&str>) -> Result<Self, ArgsError> {
        let args = match text {
            Some(text) => split_args(text).map_err(|e| e.from(SSH_ARGS_ENV))?,
            None => Vec::new(),
        };
        Ok(SshOptions { args, ..SshOptions::default() })
    }

    /// `ssh [our options] [extra args] [options] -- host`: the host comes after `--`, so
    /// ssh never reads it as an option, whatever it holds. The caller checks it with
    /// [`host_problem`](crate::host_problem) too, and adds the remote command.
    fn command(&self, host: &str, options: &[&str]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.arg("-o")
            .arg("BatchMode=yes")
            .arg("-o")
            .arg(format!("ConnectTimeout={}", self.connect_timeout))
            .args(&self.args)
            .args(options)
            .arg("--")
            .arg(host);
        cmd
    }

    /// The remote command line: environment assignments, then the program and its arguments.
    pub fn remote_command(spec: &ProcessSpec) -> String {
        let mut words = vec!["exec".to_owned(), "env".to_owned()];
        for (k, v) in &spec.env {
            words.push(shell_quote(&format!("{k}={v}")));
        }
        if spec.secret.is_some() {
            words.push(format!("{SECRET_STDIN_ENV}=1"));
        }
        words.push(shell_quote(&spec.program.to_string_lossy()));
        words.extend(spec.args.iter().map(|a| shell_quote(a)));
        words.join(" ")
    }

    /// The remote command line with this launcher's prefix, if any, after `exec`.
    fn remote_line(&self, spec: &ProcessSpec) -> String {
        let line = Self::remote_command(spec);
        match (self.remote_prefix.trim(), line.strip_prefix("exec ")) {
            ("", _) | (_, None) => line,
            (prefix, Some(rest)) => format!("exec {prefix} {rest}"),
        }
    }

    /// Starts `spec` on `spec.host` (`user@host` logs in as `user`) through ssh.
    ///
    /// # Errors
    /// [`LaunchError::BadHost`] for a host ssh could take for an option,
    /// [`LaunchError::Spawn`] when the `ssh` program cannot be run.
    fn start(&self, spec: &ProcessSpec) -> Result<Launched, LaunchError> {
        if let Some(reason) = crate::host_problem(&spec.host) {
            return Err(LaunchError::BadHost {
                name: spec.name.clone(),
                host: spec.host.clone(),
                reason: reason.to_owned(),
            });
        }
        let mut cmd = self.command(&spec.host, &[]);
        cmd.arg(self.remote_line(spec)).stdin(Stdio::piped()).stdout(Stdio::null());
        let mut launched = spawn(cmd, spec, &self.program)?;
        if let Some(mut stdin) = launched.child.stdin.take() {
            let line = spec.secret.as_ref().map(|(_, v)| format!("{v}\n")).unwrap_or_default();
            tokio::spawn(async move {
                let _ = stdin.write_all(line.as_bytes()).await;
                let _ = stdin.shutdown().await;
            });
        }
        Ok(launched)
    }

    /// The address of this host that `host` can reach us on: ssh's own view of
    /// the host name (`ssh -G`), resolved, and the local end of a route to it.
    ///
    /// # Errors
    /// [`crate::RouteError`] when the host could be taken for an option, cannot be
    /// resolved, or no route leads to it.
    pub async fn local_address_towards(&self, host: &str) -> Result<IpAddr, crate::RouteError> {
        if let Some(reason) = crate::host_problem(host) {
            return Err(crate::RouteError::BadHost { host: host.to_owned(), reason });
        }
        let out = self.command(host, &["-G"]).stdin(Stdio::null()).output().await.map_err(|source| {
            crate::RouteError::SshConfig { program: self.program.clone(), host: host.to_owned(), source }
        })?;
        let config = String::from_utf8_lossy(&out.stdout);
        let target = config
            .lines()
            .find_map(|l| l.strip_prefix("hostname "))
            .map(str::trim)
            .unwrap_or(crate::bare_host(host))
            .to_owned();
        crate::slurm::local_address_towards(&target).await
    }
}

/// Reads the session secret from standard input when the launcher said it is there.
///
/// Returns `None` when `TREECAST_SECRET_STDIN` is not set.
///
/// # Errors
/// Standard input could not be read.
pub fn secret_from_stdin() -> Option<std::io::Result<String>> {
    std::env::var_os(SECRET_STDIN_ENV)?;
    let mut line = String::new();
    Some(std::io::stdin().read_line(&mut line).map(|_| line.trim().to_owned()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_a_shell() {
        for word in ["plain", "with space", "it's", "$HOME", "a;b", "", "x=y z"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quote(word)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), word);
        }
    }

    #[test]
    fn arguments_with_spaces_are_split_as_a_shell_would() {
        let args = split_args("-F cfg -o 'ProxyCommand=ssh -W %h:%p gw'").unwrap();
        assert_eq!(args, ["-F", "cfg", "-o", "ProxyCommand=ssh -W %h:%p gw"]);
        assert!(split_args("-o 'unbalanced").unwrap_err().to_string().contains("do not balance"));
    }

    #[test]
    fn the_secret_is_not_on_the_remote_command_line() {
        let spec = ProcessSpec {
            name: "n".into(),
            host: "h".into(),
            program: "/opt/treecast".into(),
            args: vec!["node".into()],
            env: vec![("TREECAST_NODE_ID".into(), "3".into())],
            secret: Some(("TREECAST_SECRET".into(), "deadbeef".into())),
            forward_stderr: false,
            die_with_parent: true,
        };
        let line = SshOptions::remote_command(&spec);
        assert!(!line.contains("deadbeef"), "{line}");
        assert_eq!(line, "exec env 'TREECAST_NODE_ID=3' TREECAST_SECRET_STDIN=1 /opt/treecast node");
        let wrapped = SshOptions { remote_prefix: "/usr/bin/wrap -q".into(), ..SshOptions::default() };
        assert_eq!(
            wrapped.remote_line(&spec),
            "exec /usr/bin/wrap -q env 'TREECAST_NODE_ID=3' TREECAST_SECRET_STDIN=1 /opt/treecast node"
        );
    }

    fn argv(cmd: &Command) -> Vec<String> {
        cmd.as_std().get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_host_comes_after_every_option_and_a_double_dash() {
        let opts = SshOptions { args: vec!["-F".into(), "cfg".into()], ..SshOptions::default() };
        assert_eq!(
            argv(&opts.command("bob@n1", &[])),
            ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-F", "cfg", "--", "bob@n1"]
        );
        let g = argv(&opts.command("n1", &["-G"]));
        assert_eq!(&g[g.len() - 3..], ["-G", "--", "n1"]);
    }

    #[tokio::test]
    async fn hosts_that_look_like_options_never_reach_ssh() {
        // A program that would record being run: it must not be.
        let dir = std::env::temp_dir().join(format!("treecast-ssh-bad-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("ran");
        let fake = dir.join("ssh");
        std::fs::write(&fake, format!("#!/bin/sh\necho \"$@\" >> {}\nexit 1\n", log.display())).unwrap();
        std::process::Command::new("chmod").arg("+x").arg(&fake).status().unwrap();
        let opts = SshOptions { program: fake.to_string_lossy().into_owned(), ..SshOptions::default() };
        for host in ["-oProxyCommand=sh", "bob@-Fevil", "-x@n1", "", "a b", "bob@", "@n1"] {
            let spec = ProcessSpec {
                name: "n".into(),
                host: host.into(),
                program: "/bin/true".into(),
                args: vec![],
                env: vec![],
                secret: None,
                forward_stderr: false,
                die_with_parent: true,
            };
            let e = opts.launch(&spec).unwrap_err();
            assert!(matches!(e, LaunchError::BadHost { .. }), "{host}: {e}");
            let e = opts.local_address_towards(host).await.unwrap_err();
            assert!(matches!(e, crate::RouteError::BadHost { .. }), "{host}: {e}");
        }
        assert!(!log.exists(), "ssh was run: {}", std::fs::read_to_string(&log).unwrap_or_default());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_fake_ssh_gets_the_secret_on_stdin() {
        // A stand-in for ssh that runs the remote command locally.
        let dir = std::env::temp_dir().join(format!("treecast-fake-ssh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("ssh");
        std::fs::write(&fake, "#!/bin/sh\nfor last; do :; done\nexec sh -c \"$last\"\n").unwrap();
        std::process::Command::new("chmod").arg("+x").arg(&fake).status().unwrap();
        let out = dir.join("out");
        let opts = SshOptions { program: fake.to_string_lossy().into_owned(), ..SshOptions::default() };
        let spec = ProcessSpec {
            name: "n".into(),
            host: "h".into(),
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!("read s; echo \"$s $TREECAST_SECRET_STDIN $V\" > {}", out.display()),
            ],
            env: vec![("V".into(), "two words".into())],
            secret: Some(("TREECAST_SECRET".into(), "s3cret".into())),
            forward_stderr: false,
            die_with_parent: true,
        };
        let mut p = opts.launch(&spec).unwrap();
        assert_eq!(p.wait().await, "exited with status 0");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "s3cret 1 two words\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
