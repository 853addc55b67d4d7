//! Facts of the kernel's tick and time accounting: its configuration (HZ, NO_HZ_FULL,
//! VIRT_CPU_ACCOUNTING_GEN, CONTEXT_TRACKING_USER) and which CPUs are nohz_full.
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
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

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
