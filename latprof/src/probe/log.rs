//! `--debug-checks`: the eBPF side's anomaly lines (aya-log) go to latprof's log, stderr or a
//! file (`--log FILE`; top owns the terminal, so there a new file in the temporary directory).
//! latprof runs as root: the file is always created new, never through a link, and the
//! temporary one has a name nobody can guess beforehand.
use std::{
    fs::File,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use anyhow::{Context as _, Result};
use aya_log::EbpfLogger;

use super::Probe;
use crate::files::{self, Created};

/// The file the log goes to, created before the programs load.
pub struct LogFile {
    file: File,
    path: PathBuf,
    /// Created by this run (not `/dev/null`).
    new: bool,
}

impl LogFile {
    /// With `enabled` (`--debug-checks`): `path` (`--log FILE`, which must not exist unless
    /// it is a character device such as /dev/null), or where the command owns the terminal
    /// a new `latprof-RANDOM.log` in the temporary directory. `None`: no log, or stderr.
    pub fn create(enabled: bool, path: Option<&Path>, owns_terminal: bool) -> Result<Option<Self>> {
        if !enabled {
            return Ok(None);
        }
        let (file, path, new) = match path {
            Some(p) => match files::open_device(p).context("--log")? {
                Some(device) => (device, p.to_owned(), false),
                None => (
                    files::create(
                        p,
                        false,
                        0o600,
                        "latprof writes its log to a new file only: choose another name",
                    )
                    .context("--log")?,
                    p.to_owned(),
                    true,
                ),
            },
            None if owns_terminal => {
                let (file, path) = files::create_unique(&std::env::temp_dir(), "latprof-", ".log")?;
                (file, path, true)
            }
            None => return Ok(None),
        };
        Ok(Some(Self { file, path, new }))
    }

    /// What to remove if the command fails before it logs anything.
    #[must_use]
    pub fn created(&self) -> Option<Created> {
        self.new.then(|| Created::new(&self.path, &self.file))
    }
}

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
    /// With `enabled` (`--debug-checks`), reads the programs' log into `file`, or stderr.
    pub fn start(probe: &mut Probe, enabled: bool, file: Option<LogFile>) -> Result<Self> {
        if !enabled {
            return Ok(Self {
                logger: None,
                path: None,
            });
        }
        let (file, path) = file.map(|f| (f.file, f.path)).unzip();
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
