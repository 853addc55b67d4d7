//! A program the kernel's verifier rejected, said the way a user can act on: the program's
//! name, the rejected instruction and the verifier's reason (the end of its log, not its
//! informational first lines), and the whole log in a file whose path is printed.
use std::{
    fs::OpenOptions,
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use aya::programs::ProgramError;

/// Why one program did not load.
#[derive(Clone, Debug)]
pub struct Rejection {
    pub program: String,
    /// The verifier's reason: the last line of its log before the statistics.
    pub reason: String,
    /// The instruction it rejected (`1719: (7b) *(u64 *)(r3 +24) = r9`), when the log names one.
    pub instruction: Option<String>,
    /// Where the whole verifier log was written, when it could be.
    pub log: Option<PathBuf>,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the kernel's verifier rejected {}: {}",
            self.program, self.reason
        )?;
        if let Some(insn) = &self.instruction {
            write!(f, " (at {insn})")?;
        }
        match &self.log {
            Some(path) => write!(f, "; whole verifier log: {}", path.display()),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Rejection {}

/// The verifier's statistics lines that close every log, informational only.
fn is_statistics(line: &str) -> bool {
    [
        "verification time",
        "stack depth",
        "processed ",
        "max_states_per_insn",
    ]
    .iter()
    .any(|p| line.starts_with(p))
}

/// An instruction line: `1719: (7b) *(u64 *)(r3 +24) = r9`, with any register state after it
/// (`; R1_w=...`) left out.
fn instruction(line: &str) -> Option<&str> {
    let (num, _) = line.split_once(": (")?;
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(line.split(" ; ").next().unwrap_or(line).trim_end())
}

/// Cuts a quoted line to a length a terminal line holds.
fn clip(line: &str) -> String {
    const MAX: usize = 240;
    if line.chars().count() <= MAX {
        return line.to_owned();
    }
    let mut s: String = line.chars().take(MAX).collect();
    s.push_str("...");
    s
}

/// The reason and the rejected instruction, from the end of a verifier log.
#[must_use]
pub fn decisive(log: &str) -> (Option<String>, Option<String>) {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let end = lines
        .iter()
        .rposition(|l| !is_statistics(l))
        .map_or(0, |i| i + 1);
    let body = &lines[..end];
    let Some(reason) = body.last() else {
        return (None, None);
    };
    // The instruction the reason is about: the last one the log shows before it.
    let insn = body[..body.len() - 1]
        .iter()
        .rev()
        .take(8)
        .find_map(|l| instruction(l));
    (Some(clip(reason.trim())), insn.map(clip))
}

/// Writes `log` to a new file in `dir` (never through an existing file or link; readable by
/// root only, as it holds kernel addresses); returns its path.
fn write_log(dir: &Path, program: &str, log: &str) -> Option<PathBuf> {
    for n in 0..100 {
        let path = dir.join(format!(
            "latprof-verifier-{program}-{}-{n}.log",
            std::process::id()
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        match file {
            Ok(mut f) => return f.write_all(log.as_bytes()).ok().map(|()| path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(_) => return None,
        }
    }
    None
}

/// What the verifier said of `program`, its whole log written to the temporary directory.
#[must_use]
pub fn rejection(program: &str, err: &ProgramError) -> Rejection {
    match err {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let (reason, instruction) = decisive(&log);
            Rejection {
                program: program.to_owned(),
                reason: reason.unwrap_or_else(|| format!("{io_error} (the verifier said nothing)")),
                instruction,
                log: write_log(&std::env::temp_dir(), program, &log),
            }
        }
        other => Rejection {
            program: program.to_owned(),
            reason: other.to_string(),
            instruction: None,
            log: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of the log Linux 6.1 printed for `sched_wakeup` (shortened).
    const LOG_6_1: &str = "\
reg type unsupported for arg#0 function sched_wakeup#39
0: R1=ctx(off=0,imm=0) R10=fp0
; entry.records[n] = LatencyRecord {
1716: (bf) r2 = r1                    ; frame1: R1=scalar(id=6,umin=32,umax=31)
1717: (67) r2 <<= 5                   ; frame1: R2_w=scalar(umin=1024,umax=992)
1718: (0f) r3 += r2                   ; frame1: R2_w=scalar() R3_w=scalar()
1719: (7b) *(u64 *)(r3 +24) = r9
R3 invalid mem access 'scalar'
verification time 26936 usec
stack depth 64+0+136+0
processed 924 insns (limit 1000000) max_states_per_insn 4 total_states 65 peak_states 38 mark_read 13
";

    #[test]
    fn the_reason_is_the_end_not_the_first_line() {
        let (reason, insn) = decisive(LOG_6_1);
        assert_eq!(reason.as_deref(), Some("R3 invalid mem access 'scalar'"));
        assert_eq!(insn.as_deref(), Some("1719: (7b) *(u64 *)(r3 +24) = r9"));
    }

    #[test]
    fn a_log_without_instructions_still_gives_its_reason() {
        let log = "BPF_STX uses reserved fields\nverification time 686 usec\nstack depth 0+0+0+0\n\
                   processed 0 insns (limit 1000000) max_states_per_insn 0 total_states 0\n";
        let (reason, insn) = decisive(log);
        assert_eq!(reason.as_deref(), Some("BPF_STX uses reserved fields"));
        assert_eq!(insn, None);
        assert_eq!(decisive(""), (None, None));
    }

    #[test]
    fn register_state_is_left_out_of_the_instruction() {
        assert_eq!(
            instruction("1718: (0f) r3 += r2                   ; frame1: R2_w=scalar()"),
            Some("1718: (0f) r3 += r2")
        );
        assert_eq!(instruction("; entry.records[n] = LatencyRecord {"), None);
        assert_eq!(instruction("R3 invalid mem access 'scalar'"), None);
    }

    #[test]
    fn the_log_file_is_new_and_private() {
        let dir =
            std::env::temp_dir().join(format!("latprof-verifier-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let first = write_log(&dir, "p", "one").expect("first log");
        let second = write_log(&dir, "p", "two").expect("second log");
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(&first).expect("read"), "one");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&first).expect("stat").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
