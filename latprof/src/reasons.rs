//! Turning backtraces into reasons people can read: a translation table in latencytop's
//! `latencytop.trans` format, shipped in the binary and extended by a user file.
use std::path::Path;

use anyhow::{Context as _, Result, bail};

use crate::symbols::Backtrace;

/// The built-in table, written for Linux 6.x function names.
pub const BUILTIN: &str = include_str!("reasons.trans");

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    priority: u32,
    function: String,
    prefix: bool,
    reason: String,
}

impl Rule {
    fn matches(&self, function: &str) -> bool {
        if self.prefix {
            function.starts_with(&self.function)
        } else {
            function == self.function
        }
    }
}

/// The rules in force.
#[derive(Clone, Debug)]
pub struct Reasons {
    rules: Vec<Rule>,
}

/// A frame's function name as rules see it: no module, no compiler suffix.
fn function(frame: &str) -> &str {
    let name = frame.split(' ').next().unwrap_or(frame);
    name.split('.').next().unwrap_or(name)
}

fn parse(text: &str, origin: &str) -> Result<Vec<Rule>> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(priority), Some(func)) = (parts.next(), parts.next()) else {
            bail!("{origin}:{}: expected PRIORITY FUNCTION REASON", i + 1);
        };
        let Ok(priority) = priority.parse() else {
            bail!("{origin}:{}: priority {priority:?} is not a number", i + 1);
        };
        let reason = parts.collect::<Vec<_>>().join(" ");
        if reason.is_empty() {
            bail!("{origin}:{}: no reason after {func}", i + 1);
        }
        let (function, prefix) = match func.strip_suffix('*') {
            Some(stem) => (stem.to_owned(), true),
            None => (func.to_owned(), false),
        };
        rules.push(Rule {
            priority,
            function,
            prefix,
            reason,
        });
    }
    Ok(rules)
}

impl Reasons {
    /// # Panics
    ///
    /// Never: the built-in table is checked by a test.
    #[must_use]
    pub fn builtin() -> Self {
        Self {
            rules: parse(BUILTIN, "built-in reasons").expect("the built-in table parses"),
        }
    }

    /// The built-in table, plus the rules of `path` when the user gave one (`--reasons`).
    pub fn load(path: Option<&Path>) -> Result<Self> {
        path.map_or_else(|| Ok(Self::builtin()), Self::with_file)
    }

    /// The built-in table plus the rules of `path`; a user rule for a function replaces the
    /// built-in one.
    pub fn with_file(path: &Path) -> Result<Self> {
        let text = read_small(path)?;
        let user = parse(&text, &path.display().to_string())?;
        let mut rules = Self::builtin().rules;
        rules.retain(|r| {
            !user
                .iter()
                .any(|u| u.function == r.function && u.prefix == r.prefix)
        });
        rules.extend(user);
        Ok(Self { rules })
    }

    /// The reason of a backtrace. Unknown backtraces show their most telling frame, the
    /// innermost, in brackets, as latencytop does.
    #[must_use]
    pub fn reason(&self, backtrace: &Backtrace) -> String {
        let frames = match backtrace {
            Backtrace::WaitingForCpu => return "Waiting for CPU".to_owned(),
            Backtrace::Unavailable => return Backtrace::UNAVAILABLE.to_owned(),
            Backtrace::WakeupHidden => return Backtrace::WAKEUP_HIDDEN.to_owned(),
            Backtrace::Frames(frames) if frames.is_empty() => {
                return Backtrace::UNAVAILABLE.to_owned();
            }
            Backtrace::Frames(frames) => frames,
        };
        let mut best: Option<&Rule> = None;
        for frame in frames {
            let f = function(frame);
            for rule in self.rules.iter().filter(|r| r.matches(f)) {
                if best.is_none_or(|b| rule.priority > b.priority) {
                    best = Some(rule);
                }
            }
        }
        best.map_or_else(
            || format!("[{}]", function(&frames[0])),
            |r| r.reason.clone(),
        )
    }
}

/// A reasons file is a few kilobytes of rules; anything past this is not one.
const MAX_REASONS_FILE: u64 = 1 << 20;

/// The text of `path`, refused when it is not a regular file (a FIFO would block, `/dev/zero`
/// would never end) or larger than [`MAX_REASONS_FILE`].
fn read_small(path: &Path) -> Result<String> {
    use std::io::Read as _;
    let (file, len) = crate::files::open_regular(path)
        .with_context(|| format!("reasons file {}", path.display()))?;
    if len > MAX_REASONS_FILE {
        anyhow::bail!(
            "reasons file {} is {len} bytes: a reasons file is at most {MAX_REASONS_FILE}",
            path.display()
        );
    }
    let mut text = String::new();
    file.take(MAX_REASONS_FILE)
        .read_to_string(&mut text)
        .with_context(|| format!("reading reasons file {}", path.display()))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real `latprof stats --all-sleeps` output captured on this project's 6.18 kernel.
    const FIXTURE: &str = include_str!("../tests/fixtures/latency_stats-6.18.txt");

    fn frames_of(line_containing: &str) -> Backtrace {
        let line = FIXTURE
            .lines()
            .find(|l| l.contains(line_containing))
            .unwrap_or_else(|| panic!("fixture has no line with {line_containing}"));
        Backtrace::Frames(line.split(' ').skip(3).map(str::to_owned).collect())
    }

    #[test]
    fn real_backtraces_get_their_reasons() {
        let r = Reasons::builtin();
        let cases = [
            (
                "hrtimer_nanosleep common_nsleep ",
                "Application requested delay",
            ),
            ("anon_pipe_read", "Waiting for a pipe"),
            ("futex_do_wait", "Userspace lock contention"),
            ("do_wait kernel_wait4", "Waiting for a child process"),
            ("sigsuspend.isra.0", "Waiting for a signal"),
            ("do_select core_sys_select", "Waiting for an event (select)"),
            (
                "folio_wait_bit_common filemap_fault __do_fault do_fault __handle_mm_fault handle_mm_fault exc_page_fault asm_exc_page_fault\n",
                "Page fault (reading from disk)",
            ),
            (
                "folio_wait_bit_common filemap_get_pages filemap_read vfs_read",
                "Reading from disk",
            ),
            (
                "submit_bio_wait blkdev_issue_flush ext4_sync_file do_fsync",
                "fsync() on a file",
            ),
            (
                "fsync_buffers_list ext4_fsync_nojournal",
                "fsync() on a file",
            ),
            (
                "wb_wait_for_completion sync_inodes_sb",
                "sync() of all file systems",
            ),
            (
                "filemap_read __kernel_read bprm_execve",
                "Loading a program (exec)",
            ),
            (
                "__ext4_find_entry ext4_lookup path_openat do_filp_open do_sys_openat2",
                "Looking up a file name",
            ),
            (
                "htree_dirblock_to_tree ext4_htree_fill_tree ext4_readdir",
                "Reading a directory",
            ),
            ("drop_caches_sysctl_handler", "Dropping caches"),
        ];
        for (needle, reason) in cases {
            let needle = needle.trim_end_matches('\n');
            assert_eq!(r.reason(&frames_of(needle)), reason, "{needle}");
        }
    }

    /// Every rule on an x86-64 syscall entry has its arm64 twin, with the same reason; and an
    /// arm64 backtrace gets the reason its x86-64 twin gets.
    #[test]
    fn arm64_syscall_entries_have_the_reasons_of_their_x86_twins() {
        let r = Reasons::builtin();
        let text = include_str!("reasons.trans");
        let mut twins = 0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let mut f = line.split_whitespace();
            let (Some(_), Some(function)) = (f.next(), f.next()) else {
                continue;
            };
            let Some(call) = function.strip_prefix("__x64_sys_") else {
                continue;
            };
            if call == "pause" {
                continue;
            }
            let reason = |entry: &str| {
                r.reason(&Backtrace::Frames(vec![
                    "schedule".to_owned(),
                    entry.to_owned(),
                    "invoke_syscall".to_owned(),
                    "el0_svc".to_owned(),
                ]))
            };
            assert_eq!(
                reason(&format!("__arm64_sys_{call}")),
                reason(function),
                "{call}"
            );
            assert!(
                text.contains(&format!(" __arm64_sys_{call} ")),
                "no rule for __arm64_sys_{call}"
            );
            twins += 1;
        }
        assert!(twins >= 4, "{twins}");
        // Unknown on both: the first frame, whatever the entry code below it.
        let arm64 = Backtrace::Frames(vec![
            "mystery_wait".to_owned(),
            "__arm64_sys_mystery".to_owned(),
            "el0_svc".to_owned(),
        ]);
        assert_eq!(r.reason(&arm64), "[mystery_wait]");
    }

    #[test]
    fn unknown_backtraces_show_their_first_frame() {
        let r = Reasons::builtin();
        let frames = Backtrace::Frames(vec![
            "mystery_wait.constprop.0".to_owned(),
            "do_syscall_64".to_owned(),
        ]);
        assert_eq!(r.reason(&frames), "[mystery_wait]");
        assert_eq!(r.reason(&Backtrace::WaitingForCpu), "Waiting for CPU");
        assert_eq!(r.reason(&Backtrace::Unavailable), Backtrace::UNAVAILABLE);
        assert_eq!(
            r.reason(&Backtrace::Frames(Vec::new())),
            Backtrace::UNAVAILABLE
        );
    }

    #[test]
    fn priority_decides_and_prefixes_match() {
        let rules = parse("1 a Generic\n5 b Specific\n3 c* Prefixed\n", "t").unwrap();
        let r = Reasons { rules };
        let f = |v: &[&str]| Backtrace::Frames(v.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(r.reason(&f(&["b", "a"])), "Specific");
        assert_eq!(r.reason(&f(&["a", "b"])), "Specific");
        assert_eq!(r.reason(&f(&["a", "c_thing"])), "Prefixed");
        assert_eq!(r.reason(&f(&["a"])), "Generic");
    }

    #[test]
    fn user_file_overrides_and_bad_lines_are_one_clear_error() {
        let dir = std::env::temp_dir().join(format!("latprof-reasons-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.trans");
        std::fs::write(&good, "# mine\n20 hrtimer_nanosleep Sleeping on purpose\n").unwrap();
        let r = Reasons::with_file(&good).unwrap();
        assert_eq!(
            r.reason(&frames_of("hrtimer_nanosleep common_nsleep ")),
            "Sleeping on purpose"
        );
        let bad = dir.join("bad.trans");
        std::fs::write(&bad, "x hrtimer_nanosleep Oops\n").unwrap();
        let err = format!("{:#}", Reasons::with_file(&bad).unwrap_err());
        assert!(err.contains("bad.trans:1") && !err.contains('\n'), "{err}");
        assert!(Reasons::with_file(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
