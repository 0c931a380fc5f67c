//! A Go peer (a controller-runtime manager: Cluster API's, CAPO's, ORC's) run as a process
//! against a world's own real API server, in a network namespace of its own
//! (`tests/capi/isolated.sh`): its webhook server binds every address, so only relays bound to
//! 127.0.0.1 reach it, and it reaches only the ports it is given.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What to run, and what it may reach.
pub(crate) struct PeerRun {
    /// Names the peer in failures ("Cluster API's manager").
    pub(crate) name: &'static str,
    /// Starts the network namespace's name.
    pub(crate) netns: &'static str,
    pub(crate) binary: PathBuf,
    pub(crate) args: Vec<String>,
    /// Ports on 127.0.0.1 outside that the peer reaches on 127.0.0.1 inside.
    pub(crate) reach: Vec<u16>,
    /// An outside port on 127.0.0.1 relayed to the peer's webhook port 9443.
    pub(crate) serve: Option<u16>,
    pub(crate) kubeconfig: PathBuf,
}

/// A running peer; SIGTERM on drop (the peer, its relays and its namespace go).
pub(crate) struct IsolatedPeer {
    name: &'static str,
    /// The network namespace it runs in, and its binary's file name there.
    netns: String,
    binary: String,
    script: std::process::Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl IsolatedPeer {
    /// Started in `dir`, which it keeps (certificates the caller wrote there included).
    pub(crate) fn spawn(run: PeerRun, dir: tempfile::TempDir) -> Self {
        let tag = run.serve.unwrap_or_else(free_port);
        let log = dir.path().join(format!("{}.log", run.netns));
        let output = std::fs::File::create(&log).unwrap();
        let netns = format!("{}-{}-{tag}", run.netns, std::process::id());
        let mut command = std::process::Command::new("bash");
        command
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/capi/isolated.sh"
            ))
            .arg(&netns);
        for port in &run.reach {
            command.args(["--reach", &port.to_string()]);
        }
        if let Some(port) = run.serve {
            command.args(["--serve", &format!("{port}:9443")]);
        }
        let script = command
            .arg("--")
            .arg(&run.binary)
            .args(&run.args)
            .env("KUBECONFIG", &run.kubeconfig)
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .unwrap();
        let binary = (run.binary.file_name())
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        IsolatedPeer {
            name: run.name,
            netns,
            binary,
            script,
            log,
            _dir: dir,
        }
    }

    /// The peer's own process id (not its relays'), once it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        let listed = std::process::Command::new("ip")
            .args(["netns", "pids", &self.netns])
            .output()
            .ok()?;
        String::from_utf8_lossy(&listed.stdout)
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_link(format!("/proc/{pid}/exe"))
                    .is_ok_and(|exe| exe.file_name().is_some_and(|n| n == self.binary.as_str()))
            })
    }

    /// An error naming the peer and its log's end, once the peer has ended.
    pub(crate) fn ended(&mut self) -> Result<(), String> {
        match self.script.try_wait() {
            Ok(Some(status)) => Err(format!(
                "{} (tests/capi/isolated.sh) ended: {status}\n{}",
                self.name,
                self.log_tail()
            )),
            _ => Ok(()),
        }
    }

    /// The lines of the peer's whole log that hold any of `needles`.
    pub(crate) fn log_lines_with(&self, needles: &[&str]) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|line| needles.iter().any(|needle| line.contains(needle)))
            .map(str::to_owned)
            .collect()
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Polls `probe` every 500 ms until it answers, for at most two minutes; an error when
    /// the peer ended first.
    async fn wait_serving<F, E>(&mut self, what: &str, probe: impl Fn() -> F) -> Result<(), String>
    where
        F: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            self.ended()?;
            match probe().await {
                Ok(()) => return Ok(()),
                Err(error) if tokio::time::Instant::now() >= deadline => panic!(
                    "{} never answered {what}: {error}\n{}",
                    self.name,
                    self.log_tail()
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

impl IsolatedPeer {
    /// Until the peer's webhooks admit a dry-run create of `probe` (a `kind` of `api`); an
    /// error when the peer ended first.
    pub(crate) async fn wait_admitting(
        &mut self,
        api: &kube::Api<kube::api::DynamicObject>,
        probe: serde_json::Value,
    ) -> Result<(), String> {
        let what = format!("a dry-run {}", probe["kind"].as_str().unwrap_or("object"));
        let probe: kube::api::DynamicObject = serde_json::from_value(probe).unwrap();
        let dry_run = kube::api::PostParams {
            dry_run: true,
            ..kube::api::PostParams::default()
        };
        self.wait_serving(&what, || async {
            api.create(&dry_run, &probe).await.map(|_| ())
        })
        .await
    }
}

impl Drop for IsolatedPeer {
    /// SIGTERM to the script: the peer, its relays and its namespace go with it.
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.script.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.script.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.script.kill();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// The API server's port, from the kubeconfig's `server: "https://127.0.0.1:<port>"`.
pub(crate) fn api_port(kubeconfig: &Path) -> u16 {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    regex::Regex::new(r#"server: ?"?https://127\.0\.0\.1:([0-9]+)"#)
        .unwrap()
        .captures(&text)
        .and_then(|found| found[1].parse().ok())
        .unwrap_or_else(|| panic!("no server port in {}", kubeconfig.display()))
}

/// Starts a peer with `start` (which waits until it serves); a relay port taken between
/// choosing it and binding it ends the script at once, and the peer is then started again.
pub(crate) async fn start_with_retries<P>(mut start: impl AsyncFnMut() -> Result<P, String>) -> P {
    let mut tries = 0;
    loop {
        tries += 1;
        match start().await {
            Ok(peer) => return peer,
            Err(ended) if tries < 3 => eprintln!("{ended}; starting it again"),
            Err(ended) => panic!("{ended}"),
        }
    }
}

/// Polls `probe` every `every` until it answers `Ok`; an `Err` says what it saw (an API error
/// under load is not an answer). Past `limit` the test fails with `what`, the last thing seen
/// and the peers' logs.
pub(crate) async fn until<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    logs: &dyn Fn() -> String,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let seen = match probe().await {
            Ok(found) => return found,
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            // The peers' logs first: CI keeps a run's tail, and the message must be in it.
            eprintln!("{}", logs());
            panic!("never {what}; last seen: {seen}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Every YAML file of `dir` (a release's `crd/bases` in Go's module cache), in name order, one
/// object each.
pub(crate) fn yaml_files(dir: &Path) -> Vec<serde_json::Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}
