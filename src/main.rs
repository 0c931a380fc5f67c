//! The `capo-rs` binary.

use std::process::ExitCode;

use clap::Parser;

mod cli;
#[cfg(feature = "dev-tools")]
mod dev;
mod watch_lb;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // The SDK logs every request at INFO, and kube-runtime opens an INFO span per reconcile
    // beside our own: keep them to warnings unless asked. The demo shows its own view: only
    // errors, unless asked.
    let default_filter = if cli.is_demo() {
        "error"
    } else {
        "info,openstack_sdk=warn,openstack_sdk_core=warn,openstack_sdk_auth_core=warn,kube_runtime=warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("Error: {error:?}");
            ExitCode::FAILURE
        }
    }
}
