//! `--debug-checks`: the eBPF side's anomaly lines (aya-log) go to latprof's log, stderr or a
//! file (`--log FILE`; top owns the terminal, so there a file in the temporary directory).
use std::{fs::File, io::Write as _, path::PathBuf, sync::Mutex};

use anyhow::{Context as _, Result};
use aya_log::EbpfLogger;

use super::Probe;

/// Writes log records as lines to a file or stderr.
pub struct LineLog {
    out: Mutex<Option<File>>,
}

impl log::Log for LineLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = format!(
            "latprof: ebpf {}: {}\n",
            record.level().as_str().to_lowercase(),
            record.args()
        );
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match out.as_mut() {
            Some(file) => {
                let _ = file.write_all(line.as_bytes());
            }
            None => eprint!("{line}"),
        }
    }

    fn flush(&self) {}
}

/// Reads the eBPF side's log while `--debug-checks` is on; nothing otherwise.
pub struct DebugLog {
    logger: Option<EbpfLogger<LineLog>>,
    /// Where the lines go, when not stderr.
    pub path: Option<PathBuf>,
}

impl DebugLog {
    /// With `enabled` (`--debug-checks`), reads the programs' log into `path`, or stderr.
    pub fn start(probe: &mut Probe, enabled: bool, path: Option<PathBuf>) -> Result<Self> {
        if !enabled {
            return Ok(Self {
                logger: None,
                path: None,
            });
        }
        let file = match &path {
            Some(p) => Some(
                File::create(p).with_context(|| format!("cannot create log {}", p.display()))?,
            ),
            None => None,
        };
        let logger = EbpfLogger::init_with_logger(
            probe.ebpf_mut(),
            LineLog {
                out: Mutex::new(file),
            },
        )
        .context("reading the eBPF programs' log (aya-log)")?;
        Ok(Self {
            logger: Some(logger),
            path,
        })
    }

    /// Writes out what the eBPF side logged since the last call.
    pub fn flush(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }
}
