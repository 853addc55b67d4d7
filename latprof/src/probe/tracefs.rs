//! Tracepoint record layouts, read from the running kernel's tracefs `format` files.
use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};

const MOUNTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Where tracefs is mounted; mounts it on /sys/kernel/tracing when it is not.
pub fn root() -> Result<PathBuf> {
    for dir in MOUNTS {
        if fs::metadata(format!("{dir}/events")).is_ok() {
            return Ok(PathBuf::from(dir));
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: plain mount(2) with static C strings.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .context("tracefs is not mounted and mounting it on /sys/kernel/tracing failed");
    }
    Ok(PathBuf::from(MOUNTS[0]))
}

/// A field of a tracepoint record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub offset: u32,
    pub size: u32,
}

/// The parsed `format` file of one tracepoint.
#[derive(Debug)]
pub struct Format {
    event: String,
    text: String,
}

impl Format {
    pub fn read(category: &str, name: &str) -> Result<Self> {
        let path = root()?
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "tracepoint {category}:{name} not found ({})",
                path.display()
            )
        })?;
        Ok(Self::parse(&format!("{category}:{name}"), text))
    }

    pub fn parse(event: &str, text: String) -> Self {
        Self {
            event: event.to_owned(),
            text,
        }
    }

    /// Offset and size of `name`, from a line like
    /// `field:long prev_state;	offset:32;	size:8;	signed:1;`.
    pub fn field(&self, name: &str) -> Result<Field> {
        for line in self.text.lines() {
            let Some(decl) = line.trim().strip_prefix("field:") else {
                continue;
            };
            let mut parts = decl.split(';').map(str::trim);
            let Some(declared) = parts.next() else {
                continue;
            };
            let ident = declared
                .rsplit(|c: char| c.is_whitespace() || c == '*')
                .next()
                .unwrap_or("");
            let ident = ident.split('[').next().unwrap_or("");
            if ident != name {
                continue;
            }
            let mut offset = None;
            let mut size = None;
            for part in parts {
                if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse().ok();
                }
            }
            return match (offset, size) {
                (Some(offset), Some(size)) => Ok(Field { offset, size }),
                _ => bail!("{}: malformed format line for {name}: {line}", self.event),
            };
        }
        Err(anyhow!(
            "{}: this kernel's record has no field {name}",
            self.event
        ))
    }

    /// The state bit printed as `flag` (like "I" for TASK_IDLE) in the print fmt, if any.
    pub fn state_flag_bit(&self, flag: &str) -> Option<u64> {
        let needle = format!(", \"{flag}\" }}");
        let at = self.text.find(&needle)?;
        let open = self.text[..at].rfind('{')?;
        let hex = self.text[open + 1..at].trim().strip_prefix("0x")?;
        u64::from_str_radix(hex, 16).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH: &str = "name: sched_switch\nID: 372\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
        \tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
        \tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n\
        \tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n\n\
        print fmt: \"prev_state=%s\", __print_flags(REC->prev_state, \"|\", { 0x00000001, \"S\" }, \
        { 0x00000002, \"D\" }, { 0x00000080, \"I\" }) : \"R\"";

    #[test]
    fn finds_fields_by_exact_name() {
        let f = Format::parse("sched:sched_switch", SWITCH.to_owned());
        assert_eq!(
            f.field("prev_state").unwrap(),
            Field {
                offset: 32,
                size: 8
            }
        );
        assert_eq!(
            f.field("prev_pid").unwrap(),
            Field {
                offset: 24,
                size: 4
            }
        );
        assert_eq!(
            f.field("prev_comm").unwrap(),
            Field {
                offset: 8,
                size: 16
            }
        );
        assert_eq!(f.field("next_pid").unwrap().offset, 56);
        assert!(f.field("pid").is_err());
    }

    #[test]
    fn reads_state_bits_from_print_fmt() {
        let f = Format::parse("sched:sched_switch", SWITCH.to_owned());
        assert_eq!(f.state_flag_bit("I"), Some(0x80));
        assert_eq!(f.state_flag_bit("D"), Some(0x2));
        assert_eq!(f.state_flag_bit("Q"), None);
    }
}
