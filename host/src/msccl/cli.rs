//! Command-line entry (placeholder until the subcommands land).
use std::process::ExitCode;

/// Runs the subcommand with its arguments (after the subcommand name).
pub fn run(_args: &[String]) -> ExitCode {
    eprintln!("not yet implemented");
    ExitCode::from(2)
}
