//! The `capo-rs` binary.

use std::process::ExitCode;

use clap::Parser;

mod cli;
#[cfg(feature = "dev-tools")]
mod dev;
mod openstack_args;
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
    let filter = match &cli.log_level {
        Some(level) => tracing_subscriber::EnvFilter::try_new(level),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .or_else(|_| tracing_subscriber::EnvFilter::try_new(default_filter)),
    };
    let filter = match filter {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("Error: --log-level: {error}");
            return ExitCode::from(2);
        }
    };
    // Colours only on a terminal: a pod's log or a file gets plain text.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match cli.log_format {
        cli::LogFormat::Text => logs.init(),
        cli::LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    match cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("Error: {error:?}");
            ExitCode::FAILURE
        }
    }
}
