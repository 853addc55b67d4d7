//! User-space backtraces (`--user-stacks`): where in its own code a sleeping task chose to
//! sleep. The kernel walks them at switch-out and keeps each once per process
//! (`USER_STACKS`); this module reads the processes' memory maps when a backtrace is first
//! seen and names the frames.

pub mod arch;
pub mod capture;
pub mod copies;
pub mod leaf;
pub mod maps;
pub mod perf_budget;
pub mod perfmap;
pub mod resolve;
pub mod row_space;
pub mod stamp;
pub mod tables;
pub mod trampolines;
pub mod untrusted;
pub mod watch;

pub use resolve::{Resolver, TRUNCATED, UserFrame};
pub use watch::Watcher;
