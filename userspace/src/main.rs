use std::process::ExitCode;

use clap::Parser;
use stalltrace::cli::{Cli, Command, usage_error_line};
use stalltrace::error::UserError;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("stalltrace: {}", usage_error_line(&e));
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Run(args) => outcome(stalltrace::run::run(&args)),
        Command::Check(args) => {
            if stalltrace::check::check(&args) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Report(args) => outcome(stalltrace::report::command(&args)),
        Command::Investigate(args) => outcome(stalltrace::investigate::investigate(&args)),
    }
}

/// Success, or the error as one line.
fn outcome(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<UserError>() {
                Some(user) => eprintln!("stalltrace: {user}"),
                None => eprintln!("stalltrace: {}", format!("{e:#}").replace('\n', " ")),
            }
            ExitCode::FAILURE
        }
    }
}
