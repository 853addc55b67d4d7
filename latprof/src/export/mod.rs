//! Exports of one moment (or of the difference of two): the /proc/latency_stats text, JSON,
//! folded stacks for flame graphs, OpenMetrics. `stats` and `dump` share them.
pub mod cgroups;
pub mod chains;
pub mod counters;
pub mod folded;
pub mod json;
pub mod openmetrics;
pub mod pprof;
pub mod profiles;
pub mod text;

use latprof_common::{GlobalRecord, RUNQ_STACK};

use crate::{
    collect::Snapshot,
    model::{self, Cause},
    reasons::Reasons,
    store::RecordingInfo,
    symbols::Kallsyms,
};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// /proc/latency_stats (or /proc/PID/latency with --pid), byte for byte.
    #[default]
    Text,
    /// One JSON document (schema: docs/json-schema.md).
    Json,
    /// `frame;frame;frame microseconds` lines for flamegraph.pl and inferno.
    Folded,
    /// OpenMetrics text exposition, for Prometheus.
    Openmetrics,
    /// A gzipped pprof profile (perftools.profiles.Profile): one sample per backtrace with
    /// its count and nanoseconds (binary: redirect it to a file).
    Pprof,
}

/// What `stats` groups the causes by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The causes, as /proc/latency_stats.
    #[default]
    Cause,
    /// Each cgroup v2 (systemd unit, container, pod) and the causes within it.
    Cgroup,
}

/// What an export shows: `cur`'s numbers less `base`'s, for everything or one process.
pub struct Scope<'a> {
    pub cur: &'a Snapshot,
    pub base: Option<&'a Snapshot>,
    pub pid: Option<u32>,
    /// The one process the probe traced (`stats --pid`): every number in scope is already
    /// its own, its exited threads' too, so nothing is filtered, but the export says whose.
    pub traced: Option<u32>,
    pub syms: &'a Kallsyms,
    pub reasons: &'a Reasons,
    pub depth: usize,
    /// The recording's facts, when the numbers come from one.
    pub info: Option<&'a RecordingInfo>,
    /// The kernel's tick facts (from the recording, or of this machine).
    pub kernel: Option<&'a crate::probe::KernelFacts>,
    /// Levels of wait chains shown (`--chain-depth`).
    pub chain_depth: usize,
    /// The sample labels of pprof profiles (`--profile-labels`).
    pub labels: pprof::Labels,
    /// Spike events of the interval (a recording's), oldest first.
    pub spikes: &'a [crate::collect::Spike],
    /// The spike reader's sleeps by `cur` (a recording's).
    pub reader_sleeps: Option<u64>,
}

impl Scope<'_> {
    /// The records in scope, run-queue latency included.
    #[must_use]
    pub fn records(&self) -> Vec<(u64, GlobalRecord)> {
        match self.pid {
            Some(pid) => model::process_since(self.cur, self.base, pid),
            None => model::global_since(self.cur, self.base),
        }
    }

    /// Causes in scope; `runq` keeps the "[waiting for CPU]" cause (latencytop has none).
    #[must_use]
    pub fn causes(&self, runq: bool) -> Vec<Cause> {
        let records = self
            .records()
            .into_iter()
            .filter(|(stack, _)| runq || *stack != RUNQ_STACK);
        model::causes(records, self.cur, self.syms, self.depth)
    }
}

/// With `--wakers`, folded output is the waker chains, which are by cause: not with
/// `--by cgroup`.
pub fn check_wakers_flag(wakers: bool, format: Format, by: By) -> Result<(), crate::Error> {
    if wakers && format == Format::Folded && by == By::Cgroup {
        return Err(crate::Error::BadInput(
            "--wakers with --format folded prints waker chains by cause: not with --by cgroup"
                .to_owned(),
        ));
    }
    Ok(())
}

/// The export as bytes (pprof is binary; every other format is UTF-8 text).
#[must_use]
pub fn render(format: Format, scope: &Scope<'_>) -> Vec<u8> {
    match format {
        Format::Text => text::latency_stats(&scope.causes(false)).into_bytes(),
        Format::Json => json::render(scope).into_bytes(),
        Format::Folded => folded::render(&scope.causes(true)).into_bytes(),
        Format::Openmetrics => openmetrics::render(scope).into_bytes(),
        Format::Pprof => profiles::by_cause(scope),
    }
}
