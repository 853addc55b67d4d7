//! latprof: latencytop's accounting in eBPF, with a lazy mode that keeps the global table off the
//! scheduler's hot path.
//!
//! The data path: `probe` (load and attach the kernel programs) -> `collect` (read their maps
//! into raw snapshots and spikes) -> `model` (what a view shows: causes, rates, rows) -> `tui`
//! (draw); beside it `store` (recordings) and `export` (text, JSON, folded, OpenMetrics, pprof);
//! `serve` answers HTTP. `cmd` holds every subcommand's `run`, `cli` the command line.
//!
//! The modules stand on floors, each using only those below it (`cargo xtask house` checks
//! it), lowest first:
//!
//! 1. `text` (outside text made printable), `time` (clocks, durations), `files` (files root
//!    opens and creates safely), `notify` (systemd's readiness protocol), `symbols`
//!    (kallsyms, backtraces), `cpus` (the kernel's CPU lists);
//! 2. `cgroups` (cgroup ids to paths and names), `ustacks` (user backtraces: capture and
//!    naming), `reasons` (backtraces to latencytop's reasons);
//! 3. `probe`; 4. `collect`; 5. `model` and `store` (recordings know nothing of the views);
//!    6. `export`; 7. `serve` and `tui`; 8. `cli`; 9. `cmd`.
pub mod cgroups;
pub mod cli;
pub mod cmd;
pub mod collect;
pub mod cpus;
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
