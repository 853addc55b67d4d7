//! Folded stacks, the input of flamegraph.pl and inferno: `outer;...;inner value` per line,
//! outermost frame first, value in microseconds of latency.
use std::fmt::Write as _;

use crate::model::Cause;

#[must_use]
pub fn render(causes: &[Cause]) -> String {
    let mut out = String::new();
    for c in causes {
        let us = c.total_ns / 1000;
        if us == 0 {
            continue;
        }
        let mut frames = c.backtrace.lines();
        frames.reverse();
        let _ = writeln!(out, "{} {us}", frames.join(";"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::Backtrace;

    #[test]
    fn outermost_frame_first_value_last() {
        let causes = [
            Cause {
                backtrace: Backtrace::Frames(vec![
                    "hrtimer_nanosleep".into(),
                    "do_syscall_64".into(),
                ]),
                count: 2,
                total_ns: 4_000_999,
                max_ns: 2_000_000,
            },
            Cause {
                backtrace: Backtrace::Frames(vec!["ext4_sync_file [ext4]".into()]),
                count: 1,
                total_ns: 999,
                max_ns: 999,
            },
        ];
        assert_eq!(render(&causes), "do_syscall_64;hrtimer_nanosleep 4000\n");
    }
}
