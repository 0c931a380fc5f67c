//! The `capo-rs` binary.

use std::process::ExitCode;

use clap::Parser;

#[cfg(feature = "bench")]
mod bench;
mod cli;
#[cfg(feature = "demo")]
mod dev;
mod openstack_args;
mod watch_lb;

fn main() -> ExitCode {
    // First, before any thread: glibc reads its allocator's settings as a process starts, so
    // this may execute the binary again with them, and then not return.
    let tuning = capo_provider::manager::allocator::ensure();
    let cli = cli::Cli::parse();
    // The operator's level is capo-rs's own: the SDK, kube's client, hyper and h2 log requests
    // (and the SDK authentication) at info and below, so they stay at warnings unless a
    // directive names them (capo_provider::manager::log_filter). The demo shows its own view: only errors.
    let default_level = if cli.is_demo() { "error" } else { "info" };
    let asked = cli.asked_log_level();
    let filter = tracing_subscriber::EnvFilter::try_new(
        capo_provider::manager::log_filter::directives(asked.as_deref(), default_level),
    );
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
    match &tuning {
        capo_provider::manager::allocator::Tuning::Failed(error) => {
            tracing::warn!(%error, "could not start again with glibc's allocator settings: running with its defaults (set GLIBC_TUNABLES, docs/installation.md)")
        }
        other => tracing::debug!(?other, "glibc's allocator settings"),
    }
    match cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("Error: {error:?}");
            ExitCode::FAILURE
        }
    }
}
