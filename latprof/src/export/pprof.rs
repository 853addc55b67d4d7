//! pprof profiles (`perftools.profiles.Profile`, gzipped), what `go tool pprof`, Parca and
//! Pyroscope read: one sample per backtrace, with two values, the sleeps counted and their
//! nanoseconds. Frames are function names only: no kernel address goes out.
//!
//! The messages are declared here with prost's derive (the fields and tags of
//! github.com/google/pprof/proto/profile.proto), so no protoc runs at build time.
use std::{collections::HashMap, io::Write as _};

use flate2::{Compression, write::GzEncoder};
use prost::Message;

/// `perftools.profiles.Profile` (the fields latprof writes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<SampleMsg>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// The string index of the preferred sample type's name.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `perftools.profiles.Sample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampleMsg {
    /// Innermost frame first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}

/// One backtrace's numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample<'a> {
    /// Innermost first (the function that chose to sleep first).
    pub frames: Vec<&'a str>,
    pub reason: &'a str,
    pub count: u64,
    pub total_ns: u64,
}

/// A frame as a profile names it: an address the symbols did not name (printed `0x...`) is a
/// kernel address, and none goes out.
#[must_use]
pub fn public_frame(frame: &str) -> &str {
    if frame.starts_with("0x") {
        "[unknown]"
    } else {
        frame
    }
}

/// A reason as a profile or a label shows it: the reason of a backtrace no rule knows is its
/// first frame in brackets, and an unnamed one (`[0x...]`, a kernel address) gives no address
/// away.
#[must_use]
pub fn public_reason(reason: &str) -> &str {
    if reason.starts_with("[0x") {
        "[unknown]"
    } else {
        reason
    }
}

/// The string table: index 0 is "", every string once.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self::default();
        s.id("");
        s
    }

    fn id(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.index.get(text) {
            return i;
        }
        let i = i64::try_from(self.table.len()).unwrap_or(i64::MAX);
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), i);
        i
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The profile of `samples`, starting at `start_ns` (ns since the Unix epoch) and lasting
/// `duration_ns` (0: unknown).
#[must_use]
pub fn profile(samples: &[Sample<'_>], start_ns: u64, duration_ns: u64) -> Profile {
    let mut strings = Strings::new();
    let value_type = |strings: &mut Strings, t: &str, unit: &str| ValueType {
        r#type: strings.id(t),
        unit: strings.id(unit),
    };
    let sample_type = vec![
        value_type(&mut strings, "sleeps", "count"),
        value_type(&mut strings, "off_cpu", "nanoseconds"),
    ];
    // The nanoseconds: what a flame graph of off-CPU time shows first.
    let default_sample_type = strings.id("off_cpu");
    let period_type = Some(value_type(&mut strings, "sleeps", "count"));
    let mapping = vec![Mapping {
        id: 1,
        filename: strings.id("[kernel.kallsyms]"),
        has_functions: true,
    }];
    let reason_key = strings.id("reason");
    // One function and one location per distinct name (ids from 1).
    let mut locations: HashMap<&str, u64> = HashMap::new();
    let mut location = Vec::new();
    let mut function = Vec::new();
    let mut sample = Vec::with_capacity(samples.len());
    for s in samples {
        let mut ids = Vec::with_capacity(s.frames.len());
        for frame in &s.frames {
            let name = public_frame(frame);
            let id = if let Some(&id) = locations.get(name) {
                id
            } else {
                let id = location.len() as u64 + 1;
                let name_id = strings.id(name);
                function.push(Function {
                    id,
                    name: name_id,
                    system_name: name_id,
                });
                location.push(Location {
                    id,
                    mapping_id: 1,
                    line: vec![Line { function_id: id }],
                });
                locations.insert(name, id);
                id
            };
            ids.push(id);
        }
        sample.push(SampleMsg {
            location_id: ids,
            value: vec![signed(s.count), signed(s.total_ns)],
            label: vec![Label {
                key: reason_key,
                str: strings.id(public_reason(s.reason)),
            }],
        });
    }
    Profile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table: strings.table,
        time_nanos: signed(start_ns),
        duration_nanos: signed(duration_ns),
        period_type,
        period: 1,
        default_sample_type,
    }
}

/// The profile, encoded and gzipped as pprof files and `/debug/pprof` endpoints are.
#[must_use]
pub fn encode(samples: &[Sample<'_>], start_ns: u64, duration_ns: u64) -> Vec<u8> {
    let raw = profile(samples, start_ns, duration_ns).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::with_capacity(raw.len() / 2), Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = gz.write_all(&raw);
    gz.finish().unwrap_or_default()
}

/// A gzipped profile read back (as `encode` writes it, or any pprof file).
///
/// # Errors
/// Not gzip, or not a `perftools.profiles.Profile`.
pub fn decode(gz: &[u8]) -> anyhow::Result<Profile> {
    use std::io::Read as _;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut raw)?;
    Ok(Profile::decode(raw.as_slice())?)
}

impl Profile {
    /// The string at `index` of the table ("" where there is none).
    #[must_use]
    pub fn string(&self, index: i64) -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.string_table.get(i))
            .map_or("", String::as_str)
    }

    /// The function names of `sample`'s frames, innermost first.
    #[must_use]
    pub fn frame_names(&self, sample: &SampleMsg) -> Vec<&str> {
        sample
            .location_id
            .iter()
            .filter_map(|id| self.location.iter().find(|l| l.id == *id))
            .flat_map(|l| &l.line)
            .filter_map(|line| self.function.iter().find(|f| f.id == line.function_id))
            .map(|f| self.string(f.name))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(gz: &[u8]) -> Profile {
        super::decode(gz).expect("a profile")
    }

    #[test]
    fn samples_round_trip_with_names_and_no_addresses() {
        let samples = [
            Sample {
                frames: vec!["hrtimer_nanosleep", "common_nsleep", "do_syscall_64"],
                reason: "Application requested delay",
                count: 200,
                total_ns: 413_755_000,
            },
            Sample {
                frames: vec!["pipe_read", "0xffffffff81234567", "do_syscall_64"],
                reason: "Reading from a pipe",
                count: 3,
                total_ns: 9_000,
            },
            // No rule knows it and its first frame has no name: its reason is that address.
            Sample {
                frames: vec!["0xffffffffc0123456", "do_syscall_64"],
                reason: "[0xffffffffc0123456]",
                count: 1,
                total_ns: 5_000,
            },
        ];
        let p = decode(&encode(&samples, 1_700_000_000_000_000_000, 10_000_000_000));
        let s = |i: i64| p.string_table[usize::try_from(i).unwrap()].as_str();
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample.len(), 3);
        assert_eq!(p.sample[0].value, [200, 413_755_000]);
        assert_eq!(s(p.sample_type[1].unit), "nanoseconds");
        let names = |sample: &SampleMsg| -> Vec<&str> {
            sample
                .location_id
                .iter()
                .map(|id| {
                    let loc = &p.location[usize::try_from(*id).unwrap() - 1];
                    assert_eq!(loc.id, *id);
                    let f = &p.function[usize::try_from(loc.line[0].function_id).unwrap() - 1];
                    s(f.name)
                })
                .collect()
        };
        assert_eq!(
            names(&p.sample[0]),
            ["hrtimer_nanosleep", "common_nsleep", "do_syscall_64"]
        );
        assert_eq!(
            names(&p.sample[1]),
            ["pipe_read", "[unknown]", "do_syscall_64"]
        );
        // do_syscall_64 is one location shared by both.
        assert_eq!(p.location.len(), 5);
        assert_eq!(s(p.sample[1].label[0].str), "Reading from a pipe");
        assert_eq!(s(p.sample[2].label[0].str), "[unknown]");
        assert_eq!(names(&p.sample[2]), ["[unknown]", "do_syscall_64"]);
        assert!(
            p.string_table.iter().all(|t| !t.contains("0x")),
            "{:?}",
            p.string_table
        );
        assert_eq!(p.duration_nanos, 10_000_000_000);
    }
}
