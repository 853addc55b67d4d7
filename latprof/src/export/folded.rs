//! Folded stacks, the input of flamegraph.pl and inferno: `outer;...;inner value` per line,
//! outermost frame first, value in microseconds of latency.
use std::fmt::Write as _;

use std::collections::BTreeMap;

use crate::{
    model::{self, Cause, WakerId},
    symbols::Backtrace,
};

#[must_use]
pub fn render(causes: &[Cause]) -> String {
    let mut out = String::new();
    for c in causes {
        let us = c.total_ns / 1000;
        if us == 0 {
            continue;
        }
        let line = frames(&c.backtrace, c.user.iter().map(|f| f.name.as_str()));
        let _ = writeln!(out, "{} {us}", line.join(";"));
    }
    out
}

/// A cause's frames as an off-CPU flame graph stacks them, outermost first: its user frames
/// (`user`, innermost first) from main in, then the kernel's down to the function that chose
/// to sleep; a `;` in a name (the separator) shows as `:`.
pub fn frames<'a>(
    backtrace: &'a Backtrace,
    user: impl DoubleEndedIterator<Item = &'a str>,
) -> Vec<String> {
    user.rev()
        .chain(backtrace.lines().into_iter().rev())
        .map(|f| f.replace(';', ":"))
        .collect()
}

/// Wakers and sleepers, offwaketime's chains seen from the waker's side:
/// `waker;waker frames;--;sleeper frames value` per (waker, waker backtrace, sleeper cause),
/// the value the sleep time it ended in microseconds. The waker is its name and pid (a task)
/// or `interrupt: KIND`; its frames (`--waker-stacks`) run outermost first down to the wakeup
/// function, then `--`, then the sleeper's frames from the one that chose to sleep outward:
/// offwaketime's own lines read backwards, so the flame grows from the waker.
#[must_use]
pub fn render_wakers(scope: &super::Scope<'_>) -> String {
    let wakers = model::wakers_since(scope.cur, scope.base, |k| {
        scope.pid.is_none_or(|p| p == k.sleeper_tgid)
    });
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for w in &wakers {
        let id = WakerId::of(&w.key);
        let mut frames = vec![id.label(&w.comm).replace(';', ":")];
        if w.key.waker_stack != 0 {
            let mut wf = model::waker_frames(scope.cur, w.key.waker_stack, scope.syms, scope.depth);
            wf.reverse();
            frames.extend(wf);
        }
        frames.push("--".to_owned());
        let sleeper = model::backtrace_of(w.key.cause, scope.cur, scope.syms, scope.depth);
        frames.extend(sleeper.lines().into_iter().map(str::to_owned));
        *lines.entry(frames.join(";")).or_default() += w.total_ns;
    }
    text(lines)
}

/// Folded lines (`frames` -> nanoseconds) as text, in order, each value in whole microseconds;
/// a line under one is left out.
#[must_use]
pub fn text(lines: BTreeMap<String, u64>) -> String {
    let mut out = String::new();
    for (frames, ns) in lines {
        let us = ns / 1000;
        if us > 0 {
            let _ = writeln!(out, "{frames} {us}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outermost_frame_first_value_last() {
        let causes = [
            Cause {
                user: Vec::new(),
                backtrace: Backtrace::Frames(vec![
                    "hrtimer_nanosleep".into(),
                    "do_syscall_64".into(),
                ]),
                count: 2,
                total_ns: 4_000_999,
                max_ns: 2_000_000,
            },
            Cause {
                user: Vec::new(),
                backtrace: Backtrace::Frames(vec!["ext4_sync_file [ext4]".into()]),
                count: 1,
                total_ns: 999,
                max_ns: 999,
            },
        ];
        assert_eq!(render(&causes), "do_syscall_64;hrtimer_nanosleep 4000\n");
    }
}
