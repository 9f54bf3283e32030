//! `graphsafe`: plan workspaces, check the installation, and run the demo decode step.
//!
//! Exit codes: 0 success, 1 a runtime failure (e.g. a GPU check that did not hold), 2 bad arguments.

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
            // One line, as scripts expect; `--help` has the rest.
            let text = e.to_string();
            eprintln!("{}", text.lines().next().unwrap_or("error: bad arguments"));
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

/// Prints an argument error in one line and returns exit code 2.
pub(crate) fn usage_error(e: &graphsafe::Error) -> i32 {
    eprintln!("error: {e}");
    2
}
