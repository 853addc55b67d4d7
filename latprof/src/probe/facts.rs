//! Facts of the kernel's tick and time accounting: its configuration (HZ, NO_HZ_FULL,
//! VIRT_CPU_ACCOUNTING_GEN, CONTEXT_TRACKING_USER) and which CPUs are nohz_full.
use std::fmt::Write as _;
use std::io::Read as _;

use serde::Serialize;

/// What the kernel was built with and booted as; `None` where nothing says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelFacts {
    /// Where the configuration was read (`/proc/config.gz` or `/boot/config-RELEASE`).
    pub config_source: Option<String>,
    pub hz: Option<u32>,
    pub no_hz_idle: Option<bool>,
    pub no_hz_full: Option<bool>,
    pub virt_cpu_accounting_gen: Option<bool>,
    pub context_tracking_user: Option<bool>,
    /// CPUs in /sys/devices/system/cpu/nohz_full.
    pub nohz_full_cpus: Vec<u32>,
    /// Each tick program and whether this kernel has its tracepoint.
    pub tick_sources: Vec<(String, bool)>,
    /// The variant of latprof's programs that ran, in a few words (`stack cache`, `walk at
    /// wakeup`, ...); `None` where not known (recordings before format 3).
    pub programs: Option<String>,
    /// What that variant does and costs next to the best one.
    pub programs_cost: Option<String>,
    /// Why each better variant did not load.
    pub fallbacks: Vec<String>,
    /// The kernel's GNU build id in hex, from /sys/kernel/notes (profiles' kernel mapping);
    /// `None`: not known (no such file, recordings before format 8).
    pub build_id: Option<String>,
}

/// `y`/`m` -> true, `# CONFIG_X is not set` -> false, absent -> None.
fn option(config: &str, name: &str) -> Option<bool> {
    for line in config.lines() {
        if let Some(v) = line.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            return Some(matches!(v.trim(), "y" | "m"));
        }
        if line.strip_prefix("# ").and_then(|r| r.strip_prefix(name)) == Some(" is not set") {
            return Some(false);
        }
    }
    None
}

/// The facts from a kernel configuration's text.
#[must_use]
pub fn from_config(config: &str, source: &str) -> KernelFacts {
    let hz = config
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_HZ="))
        .and_then(|v| v.trim().parse().ok());
    KernelFacts {
        config_source: Some(source.to_owned()),
        hz,
        no_hz_idle: option(config, "CONFIG_NO_HZ_IDLE"),
        no_hz_full: option(config, "CONFIG_NO_HZ_FULL"),
        virt_cpu_accounting_gen: option(config, "CONFIG_VIRT_CPU_ACCOUNTING_GEN"),
        // Called CONFIG_CONTEXT_TRACKING before Linux 6.0.
        context_tracking_user: option(config, "CONFIG_CONTEXT_TRACKING_USER")
            .or_else(|| option(config, "CONFIG_CONTEXT_TRACKING")),
        ..KernelFacts::default()
    }
}

fn read_config() -> Option<(String, String)> {
    if let Ok(file) = std::fs::File::open("/proc/config.gz") {
        let mut text = String::new();
        if flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .is_ok()
        {
            return Some((text, "/proc/config.gz".to_owned()));
        }
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let path = format!("/boot/config-{}", release.trim());
    std::fs::read_to_string(&path).ok().map(|t| (t, path))
}

/// This machine's facts; `tick_sources` from the probe.
#[must_use]
pub fn kernel_facts(probe: &super::Probe) -> KernelFacts {
    let mut facts = match read_config() {
        Some((text, source)) => from_config(&text, &source),
        None => KernelFacts::default(),
    };
    facts.nohz_full_cpus = crate::cpus::nohz_full();
    facts.tick_sources = probe
        .tick_sources()
        .iter()
        .map(|(name, ok)| ((*name).to_owned(), *ok))
        .collect();
    facts.programs = Some(probe.variant().short());
    facts.programs_cost = Some(probe.variant().describe());
    facts.fallbacks = probe.fallbacks().to_vec();
    facts.build_id = std::fs::read("/sys/kernel/notes")
        .ok()
        .and_then(|notes| gnu_build_id(&notes));
    facts
}

/// The GNU build id (hex) in a sequence of ELF notes, as /sys/kernel/notes holds them: each a
/// name size, a descriptor size and a type (4 bytes each, native order), then the name and
/// the descriptor, each padded to 4 bytes. The build id is type 3 (`NT_GNU_BUILD_ID`), name
/// "GNU".
#[must_use]
pub fn gnu_build_id(notes: &[u8]) -> Option<String> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(notes.get(at..at + 4)?.try_into().ok()?))
    };
    let pad = |n: usize| n.div_ceil(4) * 4;
    let mut at = 0;
    while at + 12 <= notes.len() {
        let namesz = usize::try_from(word(at)?).ok()?;
        let descsz = usize::try_from(word(at + 4)?).ok()?;
        let kind = word(at + 8)?;
        let name = notes.get(at + 12..at + 12 + namesz)?;
        let desc_at = at + 12 + pad(namesz);
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc.iter().fold(String::new(), |mut hex, b| {
                let _ = write!(hex, "{b:02x}");
                hex
            }));
        }
        at = desc_at + pad(descsz);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_id_is_read_from_the_notes() {
        let note = |kind: u32, name: &[u8], desc: &[u8]| -> Vec<u8> {
            let mut out = Vec::new();
            let len = |b: &[u8]| u32::try_from(b.len()).unwrap();
            for w in [len(name), len(desc), kind] {
                out.extend_from_slice(&w.to_ne_bytes());
            }
            out.extend_from_slice(name);
            out.resize(out.len().div_ceil(4) * 4, 0);
            out.extend_from_slice(desc);
            out.resize(out.len().div_ceil(4) * 4, 0);
            out
        };
        // A Xen note first (as x86 kernels have), then the build id.
        let mut notes = note(6, b"Xen\0", &[1, 2, 3]);
        notes.extend(note(3, b"GNU\0", &[0xde, 0xad, 0xbe, 0xef, 0x01]));
        assert_eq!(gnu_build_id(&notes).as_deref(), Some("deadbeef01"));
        assert_eq!(gnu_build_id(&notes[..notes.len() - 4]), None);
        assert_eq!(gnu_build_id(&[]), None);
        // This machine's, where it has one: 20 bytes (SHA-1).
        if let Ok(mine) = std::fs::read("/sys/kernel/notes") {
            assert_eq!(gnu_build_id(&mine).map(|id| id.len()), Some(40));
        }
    }

    #[test]
    fn config_options() {
        let config = "\
CONFIG_HZ_250=y
CONFIG_HZ=250
CONFIG_NO_HZ_COMMON=y
# CONFIG_NO_HZ_IDLE is not set
CONFIG_NO_HZ_FULL=y
CONFIG_VIRT_CPU_ACCOUNTING_GEN=y
CONFIG_CONTEXT_TRACKING_USER=y
";
        let f = from_config(config, "/boot/config-6.12");
        assert_eq!(f.hz, Some(250));
        assert_eq!(f.no_hz_idle, Some(false));
        assert_eq!(f.no_hz_full, Some(true));
        assert_eq!(f.virt_cpu_accounting_gen, Some(true));
        assert_eq!(f.context_tracking_user, Some(true));
        let old = from_config(
            "CONFIG_CONTEXT_TRACKING=y\n# CONFIG_NO_HZ_FULL is not set\n",
            "x",
        );
        assert_eq!(old.context_tracking_user, Some(true));
        assert_eq!(old.no_hz_full, Some(false));
        assert_eq!(old.hz, None);
        // A longer name with the same prefix is another option.
        assert_eq!(option("CONFIG_HZ_1000=y\n", "CONFIG_HZ"), None);
    }
}
