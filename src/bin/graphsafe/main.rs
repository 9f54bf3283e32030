//! `graphsafe`: plan workspaces, check the installation, and run the demo decode step.
//!
//! Exit codes: 0 success, 1 a runtime failure (e.g. a GPU check that did not hold), 2 bad arguments.

// The CLI is a client of the safe API only.
#![forbid(unsafe_code)]

mod demo;
mod doctor;
mod plan;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "graphsafe", version, about = "Graph-safe CUDA kernels for LLM decode: planning, diagnostics, demo")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Workspace plans: how much to pre-grow before capturing.
    Plan {
        #[command(subcommand)]
        op: plan::PlanOp,
    },
    /// What this build contains and what this machine has (driver, GPUs).
    Doctor {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// The main job: plan a DeepSeek-V3 decode step and, with a GPU, capture and replay it safely.
    Demo,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
                let _ = e.print();
                std::process::exit(if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand { 2 } else { 0 });
            }
            eprintln!("{}", one_line(&e.to_string()));
            std::process::exit(2);
        }
    };
    let code = match cli.command {
        Command::Plan { op } => plan::run(op),
        Command::Doctor { json } => doctor::run(json),
        Command::Demo => demo::run(),
    };
    std::process::exit(code);
}

/// A clap error in one line, as scripts expect (`--help` has the rest): its first line, then the
/// lines right under it that name arguments (a missing argument's `  --seq-len <SEQ_LEN>`: without
/// them "the following required arguments were not provided:" names none), then its tip.
fn one_line(text: &str) -> String {
    let mut lines = text.lines();
    let mut line = lines.next().unwrap_or("error: bad arguments").trim_end().to_string();
    let named: Vec<&str> = lines.take_while(|l| l.starts_with("  ") && !l.trim().is_empty()).map(str::trim).collect();
    if !named.is_empty() {
        line = format!("{line} {}", named.join(", "));
    }
    if let Some(tip) = text.lines().find_map(|l| l.trim().strip_prefix("tip: ")) {
        line = format!("{line} (tip: {tip})");
    }
    line
}

/// The version of every `--json` document (`"schema_version"`): raised when a field changes
/// meaning or goes away; fields may be added without it.
pub(crate) const JSON_SCHEMA_VERSION: u32 = 1;

/// Prints an argument error in one line and returns exit code 2.
pub(crate) fn usage_error(e: &graphsafe::Error) -> i32 {
    eprintln!("error: {e}");
    2
}
