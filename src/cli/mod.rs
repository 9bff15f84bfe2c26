//! The subcommands of the `edgewatch` binary, one file each. Each parses nothing itself — clap hands it typed arguments — and is a
//! thin call into the library that turns the answer into output and an exit code. Never
//! imported by the library.

pub mod alerts;
pub mod check_config;
pub mod fleet;
pub mod fleet_quantile;
pub mod gpus;
pub mod incident;
pub mod maintain;
pub mod query;
pub mod reload;
pub mod run;
pub mod status;
pub mod tegrastats;
