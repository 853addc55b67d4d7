//! Snapshot -> what a view shows: causes named by their frames, merged and sorted (causes.rs);
//! rows of a selection since a base (rows.rs); processes (processes.rs); the header
//! (header.rs); cgroups (cgroups.rs); wakers (wakers.rs); wait chains (chains.rs); a window's sleeps by thread
//! (threads.rs).
mod causes;
mod cgroups;
mod chains;
mod header;
mod processes;
mod rows;
mod threads;
mod wakers;

pub use causes::{
    Cause, NOT_NAMED_YET, Named, backtrace_of, causes, global_causes, name, process_causes,
    site_of, spike_reason, state_of, user_frames, user_names, user_site,
};
pub use cgroups::{CgroupRow, cgroup_name, cgroups_since, container_id, row_histogram_in};
pub use chains::{Behind, Chains, Part, Sleeper, chains_since, part_label};
pub use header::{Header, header};
pub use processes::{ProcLine, processes, row_processes};
pub use rows::{
    Group, Row, SortKey, Trace, ViewContext, global_since, process_since, row_histogram, rows,
    selection_rows, since, task_records,
};
pub use threads::{ThreadBase, ThreadKey, split, threads};
pub use wakers::{
    WakerId, WakerLine, cause_wakers, row_wakers, waker_frames, waker_lines, wakers_since,
};

#[cfg(test)]
mod tests;
