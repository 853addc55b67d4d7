//! latprof: latencytop's accounting in eBPF, with a lazy mode that keeps the global table off the
//! scheduler's hot path.
//!
//! The data path: `probe` (load and attach the kernel programs) -> `collect` (read their maps
//! into raw snapshots and spikes) -> `model` (what a view shows: causes, rates, rows) -> `tui`
//! (draw); beside it `store` (recordings) and `export` (text, JSON, folded, OpenMetrics, pprof); `serve` answers HTTP.
//! `cmd` holds every subcommand's `run`.
pub mod cgroups;
pub mod cli;
pub mod cmd;
pub mod collect;
pub mod export;
pub mod files;
pub mod model;
pub mod notify;
pub mod probe;
pub mod reasons;
pub mod serve;
pub mod store;
pub mod symbols;
pub mod text;
pub mod time;
pub mod tui;
pub mod ustacks;

/// Failures a caller branches on (for the exit code).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "latprof needs root, or the CAP_BPF and CAP_PERFMON capabilities, to load eBPF programs (try: sudo latprof ...)"
    )]
    Privileges,
    /// A flag's value that cannot be used (a path that is not what it must be).
    #[error("{0}")]
    BadInput(String),
}
