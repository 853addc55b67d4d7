//! What `stats` says to a person at a terminal when its table came out empty: a quiet machine
//! shows latencytop's empty table (every interruptible sleep over 5 ms is left out, as
//! latencytop leaves it, and kernel threads stay out of the global table), which reads as
//! "latprof saw nothing". One plain line after the table names the next thing to try. Only
//! where stdout is a terminal: redirected, the output stays byte for byte latencytop's.

use std::io::{IsTerminal as _, Write};

use latprof_common::Counter;

use crate::collect::Snapshot;

/// The line for an empty latencytop table (`text`, as printed) of a run that left out
/// interruptible sleeps over `cutoff` (`all_sleeps` false), or `None` where the table holds a
/// cause.
#[must_use]
pub fn hint(
    text: &[u8],
    snap: &Snapshot,
    all_sleeps: bool,
    cutoff: std::time::Duration,
) -> Option<String> {
    let empty = text
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count()
        <= 1;
    if !empty {
        return None;
    }
    let c = &snap.counters;
    let (over, kthreads) = (c.get(Counter::SkippedCutoff), c.get(Counter::KthreadSleeps));
    let what = match (all_sleeps, over) {
        (false, n) if n > 0 => format!(
            "nothing counted outside kernel threads: {n} interruptible sleeps over the {} cutoff (`--inter-cutoff`) were left out, as latencytop leaves them. `--all-sleeps` counts every sleep; `latprof top` shows them as they happen.",
            crate::time::fmt_ns(u64::try_from(cutoff.as_nanos()).unwrap_or(u64::MAX))
        ),
        _ if kthreads > 0 => format!(
            "nothing counted outside kernel threads ({kthreads} of their sleeps stay out of the table, as in latencytop). `--pid PID` counts one process's; `latprof top` shows every process as it happens."
        ),
        _ => "nothing counted: no task slept while latprof watched. `latprof top` shows sleeps as they happen.".to_owned(),
    };
    Some(what)
}

/// Prints `hint`'s line to `out` where it is a terminal (see the module's doc).
pub fn say(out: &mut std::io::StdoutLock<'_>, line: Option<String>) -> std::io::Result<()> {
    match line {
        Some(line) if out.is_terminal() => writeln!(out, "{line}"),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use latprof_common::Counter;

    use super::hint;
    use crate::collect::Snapshot;

    const FIVE: std::time::Duration = std::time::Duration::from_millis(5);

    #[test]
    fn only_an_empty_table_gets_a_line_and_it_names_why() {
        let mut snap = Snapshot::default();
        let header = b"Latency Top version : v0.1\n";
        let full = b"Latency Top version : v0.1\n1 2 2 pipe_read vfs_read\n";
        assert_eq!(hint(full, &snap, false, FIVE), None);
        assert!(hint(header, &snap, false, FIVE).is_some_and(|l| l.contains("no task slept")));
        snap.counters.0[Counter::SkippedCutoff as usize] = 7;
        let line = hint(header, &snap, false, FIVE).expect("a line");
        assert!(
            line.contains("7 interruptible sleeps") && line.contains("--all-sleeps"),
            "{line}"
        );
        // With every sleep counted, the cutoff is not why.
        assert!(
            !hint(header, &snap, true, FIVE)
                .expect("a line")
                .contains("--all-sleeps")
        );
    }
}
