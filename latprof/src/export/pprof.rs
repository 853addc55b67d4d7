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
    /// The GNU build id, in hex.
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
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
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// The line of the function's entry (0: not known).
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Where a frame's code is: each place is a `Mapping` of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place<'a> {
    /// The kernel (`[kernel.kallsyms]`, with the kernel's build id).
    Kernel,
    /// A file a process mapped: its path as the process saw it and its GNU build id (hex;
    /// empty: none).
    File { path: &'a str, build_id: &'a str },
    /// Code in no file: JIT code, the vDSO's neighbours, a frame not named.
    Anonymous,
    /// A frame latprof adds at the root: the reason, a cgroup (`[latprof]`).
    Latprof,
}

/// One frame: its name as the views show it (a user frame's may end in ` (file:line)`) and
/// where its code is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame<'a> {
    pub name: &'a str,
    pub place: Place<'a>,
    /// Its function's entry line (user frames with DWARF; 0: not known).
    pub start_line: u32,
}

impl<'a> Frame<'a> {
    #[must_use]
    pub fn kernel(name: &'a str) -> Self {
        Self {
            name,
            place: Place::Kernel,
            start_line: 0,
        }
    }

    #[must_use]
    pub fn user(frame: &'a crate::ustacks::UserFrame) -> Self {
        Self {
            name: &frame.name,
            place: if frame.module.is_empty() {
                Place::Anonymous
            } else {
                Place::File {
                    path: &frame.module,
                    build_id: &frame.build_id,
                }
            },
            start_line: frame.start_line,
        }
    }

    #[must_use]
    pub fn latprof(name: &'a str) -> Self {
        Self {
            name,
            place: Place::Latprof,
            start_line: 0,
        }
    }
}

/// One backtrace's numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample<'a> {
    /// Innermost first (the function that chose to sleep first), the reason outermost (then,
    /// by cgroup, the cgroup): flame graphs group by it at no series' cost.
    pub frames: Vec<Frame<'a>>,
    pub reason: &'a str,
    /// "S", "D", "SD" or "R" (`model::state_of`).
    pub state: &'a str,
    /// Whose sleeps these are (`None`: not told, or no thread label asked for).
    pub thread: Option<&'a Thread>,
    pub count: u64,
    pub total_ns: u64,
}

/// The sample labels a profile carries (`--profile-labels`): each distinct value is a series
/// to a fleet backend (Pyroscope), so the reason, one of dozens, is a root frame by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one switch per label, as the flag lists them"
)]
pub struct Labels {
    pub state: bool,
    pub reason: bool,
    pub pid: bool,
    pub thread_name: bool,
    pub container_id: bool,
}

impl Labels {
    /// No label at all.
    pub const NONE: Self = Self {
        state: false,
        reason: false,
        pid: false,
        thread_name: false,
        container_id: false,
    };

    /// Whether any label shows whose sleeps a sample is (its thread).
    #[must_use]
    pub fn threads(&self) -> bool {
        self.pid || self.thread_name || self.container_id
    }

    /// `thread` with only what these labels show of it (`None`: they show nothing of it), so
    /// that samples are merged by what tells them apart.
    #[must_use]
    pub fn mask(&self, thread: Thread) -> Option<Thread> {
        if !self.threads() {
            return None;
        }
        Some(Thread {
            pid: if self.pid { thread.pid } else { 0 },
            name: if self.thread_name {
                thread.name
            } else {
                String::new()
            },
            container: thread.container.filter(|_| self.container_id),
        })
    }
}

impl Default for Labels {
    fn default() -> Self {
        Self {
            state: true,
            reason: false,
            pid: true,
            thread_name: true,
            container_id: true,
        }
    }
}

/// Whose sleeps a sample is: the process, the thread's name and the full id of the container
/// it ran in (`pid`, `thread_name` and `container_id` labels; 0, empty and `None` go out as no
/// label).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Thread {
    pub pid: u32,
    pub name: String,
    pub container: Option<String>,
}

/// What a profile needs beside its samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape<'a> {
    /// The kernel's GNU build id in hex (`/sys/kernel/notes`); empty: not known.
    pub kernel_build_id: &'a str,
    pub labels: Labels,
    /// With `--chains`: the wait chains' samples, a third sample type (`chained_off_cpu`,
    /// nanoseconds) that the other samples hold 0 of, and these nothing but.
    pub chained: Option<&'a [Chained<'a>]>,
}

/// One wait chain's time (`--chains`): the leaf part's frames first, `--` between the levels,
/// the sleeper's reason at the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chained<'a> {
    pub frames: Vec<Frame<'a>>,
    /// The sleeper's process (its labels as `Shape::labels` ask; `None`: none).
    pub thread: Option<&'a Thread>,
    pub ns: u64,
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

/// The tables a profile's frames go in: each place a mapping, each (function, file) a
/// function, each (place, frame) a location, every string once.
#[derive(Default)]
struct Tables<'a> {
    strings: Strings,
    mappings: HashMap<Place<'a>, usize>,
    mapping: Vec<Mapping>,
    functions: HashMap<(&'a str, &'a str), u64>,
    function: Vec<Function>,
    locations: HashMap<Frame<'a>, u64>,
    location: Vec<Location>,
}

impl<'a> Tables<'a> {
    fn mapping(&mut self, place: Place<'a>, kernel_build_id: &str) -> usize {
        if let Some(&i) = self.mappings.get(&place) {
            return i;
        }
        let (name, build_id) = match place {
            Place::Kernel => ("[kernel.kallsyms]", kernel_build_id),
            Place::File { path, build_id } => (path, build_id),
            Place::Anonymous => ("[anon]", ""),
            Place::Latprof => ("[latprof]", ""),
        };
        let i = self.mapping.len();
        self.mapping.push(Mapping {
            id: i as u64 + 1,
            filename: self.strings.id(name),
            build_id: self.strings.id(build_id),
            // Named already: no backend symbolizes them again.
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
        });
        self.mappings.insert(place, i);
        i
    }

    /// The location of `frame` (ids from 1), by what goes out of it.
    fn location(&mut self, frame: Frame<'a>, kernel_build_id: &str) -> u64 {
        let frame = Frame {
            name: match frame.place {
                Place::Kernel => public_frame(frame.name),
                Place::Latprof => public_reason(frame.name),
                Place::File { .. } | Place::Anonymous => frame.name,
            },
            ..frame
        };
        if let Some(&id) = self.locations.get(&frame) {
            return id;
        }
        let m = self.mapping(frame.place, kernel_build_id);
        let (name, file, line) = match frame.place {
            Place::Kernel | Place::Latprof => (frame.name, "", 0),
            Place::File { .. } | Place::Anonymous => crate::ustacks::resolve::source_of(frame.name),
        };
        if !file.is_empty() {
            self.mapping[m].has_filenames = true;
        }
        if line > 0 {
            self.mapping[m].has_line_numbers = true;
        }
        let function_id = if let Some(&id) = self.functions.get(&(name, file)) {
            id
        } else {
            let id = self.function.len() as u64 + 1;
            let name_id = self.strings.id(name);
            self.function.push(Function {
                id,
                name: name_id,
                system_name: name_id,
                filename: self.strings.id(file),
                start_line: i64::from(frame.start_line),
            });
            self.functions.insert((name, file), id);
            id
        };
        let id = self.location.len() as u64 + 1;
        self.location.push(Location {
            id,
            mapping_id: self.mapping[m].id,
            line: vec![Line { function_id, line }],
        });
        self.locations.insert(frame, id);
        id
    }
}

impl Tables<'_> {
    /// The labels of `thread` that `labels` ask for.
    fn thread_labels(&mut self, thread: &Thread, labels: Labels, out: &mut Vec<Label>) {
        let mut push = |key: &str, value: &str| {
            out.push(Label {
                key: self.strings.id(key),
                str: self.strings.id(value),
            });
        };
        if labels.pid && thread.pid != 0 {
            push("pid", &thread.pid.to_string());
        }
        if labels.thread_name && !thread.name.is_empty() {
            push("thread_name", &thread.name);
        }
        if let Some(id) = thread.container.as_deref().filter(|_| labels.container_id) {
            push("container_id", id);
        }
    }
}

/// The profile of `samples`, starting at `start_ns` (ns since the Unix epoch) and lasting
/// `duration_ns` (0: unknown): one mapping per place (the kernel with its build id, each
/// binary with its path and build id), bare function names with their source file, lines in
/// the locations, and the sample labels `shape` asks for.
#[must_use]
pub fn profile(
    samples: &[Sample<'_>],
    start_ns: u64,
    duration_ns: u64,
    shape: &Shape<'_>,
) -> Profile {
    let mut t = Tables {
        strings: Strings::new(),
        ..Tables::default()
    };
    let value_type = |strings: &mut Strings, ty: &str, unit: &str| ValueType {
        r#type: strings.id(ty),
        unit: strings.id(unit),
    };
    let mut sample_type = vec![
        value_type(&mut t.strings, "sleeps", "count"),
        value_type(&mut t.strings, "off_cpu", "nanoseconds"),
    ];
    if shape.chained.is_some() {
        sample_type.push(value_type(&mut t.strings, "chained_off_cpu", "nanoseconds"));
    }
    // The nanoseconds: what a flame graph of off-CPU time shows first.
    let default_sample_type = t.strings.id("off_cpu");
    let period_type = Some(value_type(&mut t.strings, "sleeps", "count"));
    let (state_key, reason_key) = (t.strings.id("state"), t.strings.id("reason"));
    let chained = shape.chained.unwrap_or_default();
    let mut sample = Vec::with_capacity(samples.len() + chained.len());
    for s in samples {
        let location_id = s
            .frames
            .iter()
            .map(|&f| t.location(f, shape.kernel_build_id))
            .collect();
        let mut label = Vec::new();
        if shape.labels.state {
            label.push(Label {
                key: state_key,
                str: t.strings.id(s.state),
            });
        }
        if shape.labels.reason {
            label.push(Label {
                key: reason_key,
                str: t.strings.id(public_reason(s.reason)),
            });
        }
        if let Some(thread) = s.thread {
            t.thread_labels(thread, shape.labels, &mut label);
        }
        let mut value = vec![signed(s.count), signed(s.total_ns)];
        if shape.chained.is_some() {
            value.push(0);
        }
        sample.push(SampleMsg {
            location_id,
            value,
            label,
        });
    }
    for c in chained {
        let mut label = Vec::new();
        if let Some(thread) = c.thread {
            t.thread_labels(thread, shape.labels, &mut label);
        }
        sample.push(SampleMsg {
            location_id: c
                .frames
                .iter()
                .map(|&f| t.location(f, shape.kernel_build_id))
                .collect(),
            value: vec![0, 0, signed(c.ns)],
            label,
        });
    }
    Profile {
        sample_type,
        sample,
        mapping: t.mapping,
        location: t.location,
        function: t.function,
        string_table: t.strings.table,
        time_nanos: signed(start_ns),
        duration_nanos: signed(duration_ns),
        period_type,
        period: 1,
        default_sample_type,
    }
}

/// The profile, encoded and gzipped as pprof files and `/debug/pprof` endpoints are.
#[must_use]
pub fn encode(
    samples: &[Sample<'_>],
    start_ns: u64,
    duration_ns: u64,
    shape: &Shape<'_>,
) -> Vec<u8> {
    let raw = profile(samples, start_ns, duration_ns, shape).encode_to_vec();
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

    fn kernel<'a>(names: &[&'a str], reason: &'a str) -> Vec<Frame<'a>> {
        names
            .iter()
            .map(|n| Frame::kernel(n))
            .chain([Frame::latprof(reason)])
            .collect()
    }

    #[test]
    fn samples_round_trip_with_names_and_no_addresses() {
        let samples = [
            Sample {
                frames: kernel(
                    &["hrtimer_nanosleep", "common_nsleep", "do_syscall_64"],
                    "Application requested delay",
                ),
                reason: "Application requested delay",
                state: "S",
                thread: None,
                count: 200,
                total_ns: 413_755_000,
            },
            Sample {
                frames: kernel(
                    &["pipe_read", "0xffffffff81234567", "do_syscall_64"],
                    "Reading from a pipe",
                ),
                reason: "Reading from a pipe",
                state: "S",
                thread: None,
                count: 3,
                total_ns: 9_000,
            },
            // No rule knows it and its first frame has no name: its reason is that address.
            Sample {
                frames: kernel(
                    &["0xffffffffc0123456", "do_syscall_64"],
                    "[0xffffffffc0123456]",
                ),
                reason: "[0xffffffffc0123456]",
                state: "D",
                thread: None,
                count: 1,
                total_ns: 5_000,
            },
        ];
        let shape = Shape {
            kernel_build_id: "00112233",
            labels: Labels {
                state: true,
                reason: true,
                ..Labels::NONE
            },
            chained: None,
        };
        let p = decode(&encode(
            &samples,
            1_700_000_000_000_000_000,
            10_000_000_000,
            &shape,
        ));
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample.len(), 3);
        assert_eq!(p.sample[0].value, [200, 413_755_000]);
        assert_eq!(p.string(p.sample_type[1].unit), "nanoseconds");
        assert_eq!(
            p.frame_names(&p.sample[0]),
            [
                "hrtimer_nanosleep",
                "common_nsleep",
                "do_syscall_64",
                "Application requested delay"
            ]
        );
        assert_eq!(
            p.frame_names(&p.sample[1]),
            [
                "pipe_read",
                "[unknown]",
                "do_syscall_64",
                "Reading from a pipe"
            ]
        );
        // do_syscall_64 is one location shared by all, so is [unknown]; the reasons are three
        // more (the unknown one apart: another mapping).
        assert_eq!(p.location.len(), 8);
        let labels = |i: usize| -> Vec<(&str, &str)> {
            p.sample[i]
                .label
                .iter()
                .map(|l| (p.string(l.key), p.string(l.str)))
                .collect()
        };
        assert_eq!(
            labels(1),
            [("state", "S"), ("reason", "Reading from a pipe")]
        );
        assert_eq!(labels(2), [("state", "D"), ("reason", "[unknown]")]);
        assert_eq!(
            p.frame_names(&p.sample[2]),
            ["[unknown]", "do_syscall_64", "[unknown]"]
        );
        assert!(
            p.string_table.iter().all(|t| !t.contains("0x")),
            "{:?}",
            p.string_table
        );
        assert_eq!(p.duration_nanos, 10_000_000_000);
        // The kernel's mapping with its build id, the reasons' apart.
        let files: Vec<(&str, &str, bool)> = p
            .mapping
            .iter()
            .map(|m| (p.string(m.filename), p.string(m.build_id), m.has_functions))
            .collect();
        assert_eq!(
            files,
            [
                ("[kernel.kallsyms]", "00112233", true),
                ("[latprof]", "", true)
            ]
        );
    }

    /// A sample's thread goes out as the labels asked for: pid, thread name and the full
    /// container id, each left out where unknown or not asked for.
    #[test]
    fn threads_are_labelled_as_asked() {
        let id = "0123456789abcdef".repeat(4);
        let in_container = Thread {
            pid: 4242,
            name: "worker 1".to_owned(),
            container: Some(id.clone()),
        };
        let on_host = Thread {
            pid: 7,
            name: "sshd".to_owned(),
            container: None,
        };
        let sample = |thread| Sample {
            frames: kernel(&["pipe_read"], "Reading from a pipe"),
            reason: "Reading from a pipe",
            state: "S",
            thread,
            count: 1,
            total_ns: 10,
        };
        let samples = [
            sample(Some(&in_container)),
            sample(Some(&on_host)),
            sample(None),
        ];
        let labels_of = |labels: Labels| -> Vec<Vec<(String, String)>> {
            let p = decode(&encode(
                &samples,
                0,
                0,
                &Shape {
                    labels,
                    ..Shape::default()
                },
            ));
            p.sample
                .iter()
                .map(|s| {
                    s.label
                        .iter()
                        .map(|l| (p.string(l.key).to_owned(), p.string(l.str).to_owned()))
                        .collect()
                })
                .collect()
        };
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            labels_of(Labels::default()),
            [
                pairs(&[
                    ("state", "S"),
                    ("pid", "4242"),
                    ("thread_name", "worker 1"),
                    ("container_id", &id)
                ]),
                pairs(&[("state", "S"), ("pid", "7"), ("thread_name", "sshd")]),
                pairs(&[("state", "S")]),
            ]
        );
        let pid_only = Labels {
            pid: true,
            ..Labels::NONE
        };
        assert_eq!(
            labels_of(pid_only),
            [pairs(&[("pid", "4242")]), pairs(&[("pid", "7")]), vec![]]
        );
        // Masked to what the labels show: threads alike in it merge.
        assert_eq!(
            pid_only.mask(in_container.clone()),
            Some(Thread {
                pid: 4242,
                ..Thread::default()
            })
        );
        assert_eq!(Labels::NONE.mask(in_container.clone()), None);
        assert!(labels_of(Labels::NONE).iter().all(Vec::is_empty));
    }

    /// User frames: one mapping per file with its build id, bare function names with their
    /// source file and entry line, the line in the location; code in no file under `[anon]`.
    #[test]
    fn user_frames_have_a_mapping_per_binary_and_lines() {
        let frame = |name: &str, module: &str, build_id: &str| crate::ustacks::UserFrame {
            name: name.to_owned(),
            module: module.to_owned(),
            build_id: build_id.to_owned(),
            offset: 0,
            named: true,
            // The entry lines of server.c's functions.
            start_line: match name.split_once(' ') {
                Some(("wait_for_request", _)) => 18,
                Some(("serve", _)) => 35,
                _ => 0,
            },
        };
        let user = [
            frame(
                "__GI___libc_read",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "aa11",
            ),
            frame("wait_for_request (server.c:21)", "/srv/server", "bb22"),
            frame("serve (server.c:40)", "/srv/server", "bb22"),
            frame("wait_for_request (server.c:23)", "/srv/server", "bb22"),
            frame("LazyCompile:*work", "", ""),
        ];
        let frames: Vec<Frame<'_>> = [Frame::kernel("pipe_read")]
            .into_iter()
            .chain(user.iter().map(Frame::user))
            .chain([Frame::latprof("Reading from a pipe")])
            .collect();
        let samples = [Sample {
            frames,
            reason: "Reading from a pipe",
            state: "S",
            thread: None,
            count: 1,
            total_ns: 10,
        }];
        let p = decode(&encode(&samples, 0, 0, &Shape::default()));
        let mapping = |id: u64| &p.mapping[usize::try_from(id).unwrap() - 1];
        let located: Vec<(&str, &str, i64, &str, &str)> = p.sample[0]
            .location_id
            .iter()
            .map(|id| {
                let loc = &p.location[usize::try_from(*id).unwrap() - 1];
                let f = &p.function[usize::try_from(loc.line[0].function_id).unwrap() - 1];
                let m = mapping(loc.mapping_id);
                (
                    p.string(f.name),
                    p.string(f.filename),
                    loc.line[0].line,
                    p.string(m.filename),
                    p.string(m.build_id),
                )
            })
            .collect();
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        assert_eq!(
            located,
            [
                ("pipe_read", "", 0, "[kernel.kallsyms]", ""),
                ("__GI___libc_read", "", 0, libc, "aa11"),
                ("wait_for_request", "server.c", 21, "/srv/server", "bb22"),
                ("serve", "server.c", 40, "/srv/server", "bb22"),
                ("wait_for_request", "server.c", 23, "/srv/server", "bb22"),
                ("LazyCompile:*work", "", 0, "[anon]", ""),
                ("Reading from a pipe", "", 0, "[latprof]", ""),
            ]
        );
        // wait_for_request is one function at two lines, from its entry line; the server one
        // mapping.
        assert_eq!(p.function.len(), 6);
        let starts: Vec<(&str, i64)> = p
            .function
            .iter()
            .filter(|f| f.start_line > 0)
            .map(|f| (p.string(f.name), f.start_line))
            .collect();
        assert_eq!(starts, [("wait_for_request", 18), ("serve", 35)]);
        assert_eq!(p.mapping.len(), 5);
        let server = p
            .mapping
            .iter()
            .find(|m| p.string(m.filename) == "/srv/server")
            .unwrap();
        assert!(server.has_functions && server.has_filenames && server.has_line_numbers);
        let libc = p
            .mapping
            .iter()
            .find(|m| p.string(m.filename) == libc)
            .unwrap();
        assert!(libc.has_functions && !libc.has_filenames);
    }

    #[test]
    fn source_lines_are_split_from_names() {
        use crate::ustacks::resolve::{function, source_of};
        assert_eq!(
            source_of("wait_for_request (server.c:21)"),
            ("wait_for_request", "server.c", 21)
        );
        // A demangled C++ name holds " (" of its own.
        let run = "std::thread::_State_impl<std::tuple<void (*)(int), int> >::_M_run()";
        let named = format!("{run} (/usr/include/c++/12/bits/std_thread.h:211)");
        assert_eq!(
            source_of(&named),
            (run, "/usr/include/c++/12/bits/std_thread.h", 211)
        );
        assert_eq!(function(&named), run);
        assert_eq!(source_of(run), (run, "", 0));
        assert_eq!(
            source_of("(anonymous namespace)::f"),
            ("(anonymous namespace)::f", "", 0)
        );
        assert_eq!(source_of("g (x.c:nope)"), ("g (x.c:nope)", "", 0));
    }

    /// With chains, a third sample type: the backtraces' samples hold none of it, the chains'
    /// nothing else, so each type sums what it did without them.
    #[test]
    fn chains_are_a_sample_type_of_their_own() {
        let samples = [Sample {
            frames: vec![
                Frame::kernel("pipe_read"),
                Frame::latprof("Reading from a pipe"),
            ],
            reason: "Reading from a pipe",
            state: "S",
            thread: None,
            count: 3,
            total_ns: 9_000,
        }];
        let thread = Thread {
            pid: 42,
            ..Thread::default()
        };
        let chained = [Chained {
            frames: vec![
                Frame::kernel("jbd2_log_wait_commit"),
                Frame::latprof("--"),
                Frame::kernel("pipe_read"),
                Frame::latprof("Reading from a pipe"),
            ],
            thread: Some(&thread),
            ns: 7_000,
        }];
        let shape = |chained| Shape {
            labels: Labels::default(),
            chained,
            ..Shape::default()
        };
        let types = |p: &Profile| -> Vec<String> {
            p.sample_type
                .iter()
                .map(|t| format!("{}/{}", p.string(t.r#type), p.string(t.unit)))
                .collect()
        };
        let plain = decode(&encode(&samples, 0, 0, &shape(None)));
        assert_eq!(types(&plain), ["sleeps/count", "off_cpu/nanoseconds"]);
        let p = decode(&encode(&samples, 0, 0, &shape(Some(&chained))));
        assert_eq!(
            types(&p),
            [
                "sleeps/count",
                "off_cpu/nanoseconds",
                "chained_off_cpu/nanoseconds"
            ]
        );
        let values: Vec<&[i64]> = p.sample.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(values, [&[3, 9_000, 0][..], &[0, 0, 7_000][..]]);
        assert_eq!(
            p.frame_names(&p.sample[1]),
            [
                "jbd2_log_wait_commit",
                "--",
                "pipe_read",
                "Reading from a pipe"
            ]
        );
        let label = &p.sample[1].label;
        assert_eq!(label.len(), 1);
        assert_eq!(
            (p.string(label[0].key), p.string(label[0].str)),
            ("pid", "42")
        );
        // An empty chain table still gives the type: the profile's shape is the flag's.
        let empty = decode(&encode(&samples, 0, 0, &shape(Some(&[]))));
        assert_eq!(types(&empty).len(), 3);
    }
}
