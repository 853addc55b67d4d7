//! The /proc/latency_stats and /proc/PID/latency text format, byte for byte:
//! `Latency Top version : v0.1`, then `count total max frame frame ...` per cause. With
//! `--user-stacks` a cause's line goes on with ` |` and its user frames, innermost first (the
//! kernel never had them: only then does the text differ from its format).
use std::fmt::Write as _;

use crate::model::Cause;

pub const HEADER: &str = "Latency Top version : v0.1\n";

/// Renders causes; times in microseconds (latprof's are true microseconds, ns / 1000).
#[must_use]
pub fn latency_stats(causes: &[Cause]) -> String {
    let mut out = String::from(HEADER);
    for c in causes {
        let _ = write!(out, "{} {} {}", c.count, c.total_ns / 1000, c.max_ns / 1000);
        for f in c.backtrace.lines() {
            out.push(' ');
            out.push_str(f);
        }
        if !c.user.is_empty() {
            out.push_str(" |");
            for f in &c.user {
                out.push(' ');
                out.push_str(&f.name);
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::Backtrace;

    #[test]
    fn matches_the_kernel_format() {
        let causes = [
            Cause {
                user: Vec::new(),
                backtrace: Backtrace::Frames(vec![
                    "hrtimer_nanosleep".into(),
                    "common_nsleep".into(),
                ]),
                count: 200,
                total_ns: 412_345_999,
                max_ns: 2_100_999,
            },
            Cause {
                user: Vec::new(),
                backtrace: Backtrace::Frames(vec!["ext4_sync_file [ext4]".into()]),
                count: 1,
                total_ns: 999,
                max_ns: 999,
            },
        ];
        assert_eq!(
            latency_stats(&causes),
            "Latency Top version : v0.1\n\
             200 412345 2100 hrtimer_nanosleep common_nsleep\n\
             1 0 0 ext4_sync_file [ext4]\n"
        );
        assert_eq!(latency_stats(&[]), HEADER);
    }

    #[test]
    fn user_frames_follow_a_bar() {
        let causes = [Cause {
            user: ["__libc_read", "main"]
                .map(crate::ustacks::UserFrame::marker)
                .to_vec(),
            backtrace: Backtrace::Frames(vec!["pipe_read".into()]),
            count: 2,
            total_ns: 4_000,
            max_ns: 3_000,
        }];
        assert_eq!(
            latency_stats(&causes),
            "Latency Top version : v0.1\n2 4 3 pipe_read | __libc_read main\n"
        );
    }
}
