//! `docs/walkthrough.md` as pasted: its three terminals' servers from the binary the tests
//! built (as `target/debug/capo-rs`, the path the page names), then the fourth terminal's
//! block against them: a Secret and an OpenStackServer that reaches Ready, is described and
//! deleted. The test puts the servers on free ports and its files in its own directory rather
//! than the page's fixed ports and `/tmp` paths, and gives the controllers a free admin port.

use std::path::Path;
use std::process::Stdio;

use crate::book::{book_block, paste};

/// A line of the page with the test's ports, files and admin port in place of the page's.
fn own_ports_and_files(line: &str, dir: &Path) -> String {
    let dir = dir.display();
    let line = line
        .replace("127.0.0.1:6443", "127.0.0.1:0")
        .replace("127.0.0.1:5000", "127.0.0.1:0")
        .replace("/tmp/sim.kubeconfig", &format!("{dir}/sim.kubeconfig"))
        .replace("/tmp/sim-clouds.yaml", &format!("{dir}/sim-clouds.yaml"));
    match line.contains(" run --kubeconfig") {
        true => format!("{line} --admin-address 127.0.0.1:0"),
        false => line,
    }
}

/// One terminal: `line` run by bash until the test ends, its output in `log`.
fn terminal(line: &str, dir: &Path, log: &str) -> tokio::process::Child {
    let log = std::fs::File::create(dir.join(log)).unwrap();
    tokio::process::Command::new("bash")
        .args(["-c", &format!("exec {line}")])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("bash")
}

async fn until_written(file: &Path) {
    crate::server_controller::eventually(&format!("{} written", file.display()), || async {
        std::fs::metadata(file)
            .ok()
            .filter(|m| m.len() > 0)
            .map(|_| ())
    })
    .await;
}

#[tokio::test]
async fn the_walkthrough_runs_as_pasted() {
    let Some(kubectl) = std::env::var_os("CAPO_REAL_KUBE_BIN") else {
        eprintln!("the walkthrough needs kubectl (CAPO_REAL_KUBE_BIN, tests/kube/up.sh): not run");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let built = dir.path().join("target/debug");
    std::fs::create_dir_all(&built).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_capo-rs"), built.join("capo-rs")).unwrap();

    let servers = book_block("walkthrough.md", "cargo build");
    let servers: Vec<String> = servers
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#'))
        .map(|line| own_ports_and_files(line, dir.path()))
        .collect();
    let [kube, openstack, controllers] = &servers[..] else {
        panic!("the walkthrough's three terminals: {servers:?}");
    };
    let _kube = terminal(kube, dir.path(), "kube.log");
    let _openstack = terminal(openstack, dir.path(), "openstack.log");
    until_written(&dir.path().join("sim.kubeconfig")).await;
    until_written(&dir.path().join("sim-clouds.yaml")).await;
    let _controllers = terminal(controllers, dir.path(), "controllers.log");

    let fourth = own_ports_and_files(
        &book_block("walkthrough.md", "export KUBECONFIG=/tmp/sim.kubeconfig"),
        dir.path(),
    );
    let (made, rest) = fourth
        .split_once("kubectl describe oss bastion")
        .expect("the page describes the server after its watch");
    let export = made.lines().next().unwrap_or_default();
    let env = [
        ("HOME", dir.path().display().to_string()),
        (
            "PATH",
            format!(
                "{}:{}",
                kubectl.to_string_lossy(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
    ];
    paste(made, dir.path(), &env).await;
    // In place of the page's watch, which runs until interrupted.
    paste(
        &format!("{export}\nkubectl wait --for=condition=Ready oss/bastion --timeout=120s\n"),
        dir.path(),
        &env,
    )
    .await;
    let said = paste(
        &format!("{export}\nkubectl describe oss bastion{rest}"),
        dir.path(),
        &env,
    )
    .await;
    for shown in ["InstanceReady", "ACTIVE", "Ready"] {
        assert!(
            said.contains(shown),
            "the walkthrough's describe shows {shown}:\n{said}"
        );
    }
    let left = paste(
        &format!("{export}\nkubectl get oss -o name\n"),
        dir.path(),
        &env,
    )
    .await;
    assert!(
        left.trim().is_empty(),
        "the server is gone once deleted: {left}"
    );
}
