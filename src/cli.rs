//! The `capo-rs` command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::api::crds;

/// capo-rs: Cluster API infrastructure provider for OpenStack.
#[derive(Debug, Parser)]
#[command(name = "capo-rs", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print every CRD as one multi-document YAML stream, or write one file per CRD.
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs a parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds { out: None } => {
            print!("{}", crds::to_multi_yaml(&crds::all())?);
        }
        Command::Crds { out: Some(dir) } => {
            for path in crds::write_dir(&crds::all(), &dir)? {
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
