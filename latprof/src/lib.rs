//! latprof: latencytop's accounting in eBPF, with a lazy mode that keeps the global table off the
//! scheduler's hot path.
pub mod bench;
pub mod cli;
pub mod clock;
pub mod collect;
pub mod debuglog;
pub mod dump;
pub mod duration;
pub mod export;
pub mod model;
pub mod nohz;
pub mod probe;
pub mod reasons;
pub mod record;
pub mod spikes;
pub mod stats;
pub mod store;
pub mod symbols;
pub mod tui;
pub mod workload;

/// Failures a caller branches on (for the exit code).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "latprof needs root, or the CAP_BPF and CAP_PERFMON capabilities, to load eBPF programs (try: sudo latprof ...)"
    )]
    Privileges,
}
