//! `edgewatch tegrastats ...`: Jetson tegrastats tools; `parse` turns tegrastats lines into
//! one JSON object per line, as the collector would read them. Never starts tegrastats.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Subcommand)]
pub enum TegrastatsCommand {
    /// Parse tegrastats lines (a file, or - / nothing for stdin) into one JSON object per line.
    Parse {
        /// Input file; `-` or absent reads stdin.
        file: Option<PathBuf>,
    },
}

pub fn run(command: TegrastatsCommand) -> anyhow::Result<ExitCode> {
    match command {
        TegrastatsCommand::Parse { file } => parse(file),
    }
}

fn parse(file: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let input = file.filter(|f| f.as_os_str() != "-");
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut err = std::io::stderr().lock();
    let ok = edgewatch::collect::tegrastats::parse_command(input.as_deref(), &mut out, &mut err)
        .context("reading tegrastats input")?;
    out.flush()?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
