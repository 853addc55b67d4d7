//! The recording format's tests: round trips, recovery from damage, and fuzzing of the reader.
use latprof_common::{
    Counter, GlobalRecord, HIST_BUCKETS, LatencyRecord, RUNQ_STACK, TICK_COUNTER_COUNT,
};

use super::{
    codec::{Dec, Enc},
    reader::Recording,
    writer::{Options, Writer},
    *,
};
use crate::{
    collect::{Snapshot, TaskSnapshot},
    probe::Mode,
    symbols::Kallsyms,
};

pub const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81200000 T hrtimer_nanosleep
ffffffff81300000 T anon_pipe_read
ffffffff81400000 T __sched_text_start
ffffffff81400010 T schedule
ffffffff81401000 T __sched_text_end
ffffffffc0000000 t ext4_sync_file\t[ext4]
";

pub fn info() -> RecordingInfo {
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let (sched_text, lock_text) = syms.ranges();
    RecordingInfo {
        latprof_version: "0.1.0".into(),
        hostname: "test".into(),
        kernel_release: "6.18.0".into(),
        kernel_version: "#1 SMP".into(),
        cpus: 2,
        mode: Mode::Lazy,
        interval_ns: 1_000_000_000,
        stack_depth: 12,
        details: true,
        spike_ns: 10_000_000,
        wakers: true,
        waker_stacks: true,
        user_stacks: true,
        chains: true,
        kernel: crate::probe::KernelFacts {
            config_source: Some("/boot/config-6.18.0".into()),
            hz: Some(250),
            no_hz_full: Some(false),
            nohz_full_cpus: vec![1],
            tick_sources: vec![("tick_stop".into(), true), ("user_enter".into(), false)],
            programs: Some("walk at wakeup, no CAS".into()),
            programs_cost: Some("backtraces walked at wakeup".into()),
            fallbacks: vec!["no bpf_loop".into(), "no BPF compare-and-swap".into()],
            build_id: Some("0123456789abcdef0123456789abcdef01234567".into()),
            ..Default::default()
        },
        sched_text,
        lock_text,
    }
}

fn rec(stack_id: u64, count: u64) -> LatencyRecord {
    LatencyRecord {
        stack_id,
        count,
        total_ns: count * 2_000_000,
        max_ns: 2_100_000 + count,
        // A cgroup per cause (format 5).
        cgroup: 4000 + stack_id % 7,
    }
}

/// A run that changes: tasks come and go, records grow, backtraces appear.
#[expect(
    clippy::too_many_lines,
    reason = "one made-up recording with every kind of record, built in one place"
)]
pub fn snapshots(n: u64) -> Vec<Snapshot> {
    (0..n)
        .map(|i| {
            let mut s = Snapshot {
                mode: Mode::Lazy,
                skip_kthreads: true,
                taken_ns: 1_000_000_000 * (i + 1),
                wall_ns: 1_790_000_000_000_000_000 + 1_000_000_000 * i,
                ..Snapshot::default()
            };
            s.counters.0[Counter::Counted as usize] = 100 * i;
            s.stacks
                .insert(1, vec![0xffff_ffff_8140_0020, 0xffff_ffff_8120_0010]);
            s.tasks.push(TaskSnapshot {
                tid: 100,
                tgid: 100,
                comm: "sleeper".into(),
                kthread: false,
                task_only: 0,
                records: vec![rec(1, 10 * i + 1), rec(RUNQ_STACK, i + 1)],
            });
            // A short-lived process every third snapshot, merged into the global table after.
            if i % 3 == 1 {
                s.stacks
                    .insert(2, vec![0xffff_ffff_8140_0020, 0xffff_ffff_c000_0042]);
                s.tasks.push(TaskSnapshot {
                    tid: 1000 + u32::try_from(i).unwrap(),
                    tgid: 1000 + u32::try_from(i).unwrap(),
                    comm: "fsyncer".into(),
                    kthread: false,
                    // Its record was accounted after exit_mm: the task's own (format 4).
                    task_only: 0b1,
                    records: vec![rec(2, 3)],
                });
            }
            if i >= 2 {
                s.stacks
                    .insert(2, vec![0xffff_ffff_8140_0020, 0xffff_ffff_c000_0042]);
                s.global.push((
                    2,
                    GlobalRecord {
                        count: 3 * ((i + 1) / 3),
                        total_ns: 6_000_000 * ((i + 1) / 3),
                        max_ns: 2_100_003,
                    },
                ));
            }
            let mut h = [0u32; HIST_BUCKETS];
            h[11] = u32::try_from(10 * i + 1).unwrap();
            s.histograms.insert(1, h);
            // Exited tasks' records by cgroup, and the cgroups' paths (format 5); one
            // cgroup removed from the fourth snapshot on, one never seen in the file system.
            if i >= 2 {
                s.cgroups.push((
                    latprof_common::CgroupCause {
                        cgroup: 4002,
                        stack_id: 2,
                    },
                    GlobalRecord {
                        count: 3 * ((i + 1) / 3),
                        total_ns: 6_000_000 * ((i + 1) / 3),
                        max_ns: 2_100_003,
                    },
                ));
                s.cgroup_paths.insert(
                    4002,
                    crate::cgroups::CgroupPath {
                        path: Some("/system.slice/fsync.service".into()),
                        removed: i >= 3,
                    },
                );
            }
            // Exited tasks' sums (format 9): one thread's, then a second thread's.
            if i >= 1 {
                let mut comm = [0u8; 16];
                comm[..6].copy_from_slice(b"worker");
                let mut exited = std::collections::BTreeMap::new();
                exited.insert(
                    crate::collect::ExitKey {
                        tgid: 77,
                        comm,
                        cgroup: 4002,
                        stack_id: 1,
                    },
                    GlobalRecord {
                        count: i,
                        total_ns: 1_000 * i,
                        max_ns: 1_000,
                    },
                );
                if i >= 3 {
                    comm[..6].copy_from_slice(b"helper");
                    exited.insert(
                        crate::collect::ExitKey {
                            tgid: 78,
                            comm,
                            cgroup: 0,
                            stack_id: 2,
                        },
                        GlobalRecord {
                            count: 1,
                            total_ns: 9_000,
                            max_ns: 9_000,
                        },
                    );
                }
                s.exited = std::sync::Arc::new(exited);
            }
            s.cgroup_paths.insert(
                4001,
                crate::cgroups::CgroupPath {
                    path: None,
                    removed: true,
                },
            );
            // The wakers (format 6): a task and a timer, one with its backtrace.
            s.stacks
                .insert(3, vec![0xffff_ffff_8140_0410, 0xffff_ffff_8130_0010]);
            s.wakers = vec![
                crate::collect::Waker {
                    key: latprof_common::WakerKey {
                        cause: 1,
                        waker_stack: 3,
                        sleeper_tgid: 100,
                        kind: latprof_common::WAKER_TASK,
                        waker_tgid: 200,
                        waker_tid: 201,
                    },
                    count: 5 * i + 1,
                    total_ns: 10_000_000 * i + 1,
                    max_ns: 2_000_000,
                    comm: "waker".into(),
                },
                crate::collect::Waker {
                    key: latprof_common::WakerKey {
                        cause: 1,
                        waker_stack: 0,
                        sleeper_tgid: 100,
                        kind: latprof_common::WAKER_TIMER,
                        waker_tgid: 0,
                        waker_tid: 0,
                    },
                    count: 5 * i,
                    total_ns: 10_000_000 * i,
                    max_ns: 2_000_000,
                    comm: String::new(),
                },
            ];
            s.wakers.retain(|w| w.count > 0);
            // Wait chains (format 10): cause 1's sleeps behind the waker's own sleeps at cause
            // 1, and the rest with the waker running.
            s.chains = vec![
                crate::collect::Chain {
                    key: latprof_common::ChainKey {
                        cause: 1,
                        waker_cause: 1,
                        sleeper_tgid: 100,
                        waker_tgid: 200,
                        link: latprof_common::CHAIN_SLEPT,
                        pad: 0,
                    },
                    count: 4 * i + 1,
                    total_ns: 8_000_000 * i + 1,
                    behind_ns: 7_000_000 * i,
                    runq_ns: 1,
                    comm: "waker".into(),
                },
                crate::collect::Chain {
                    key: latprof_common::ChainKey {
                        cause: 1,
                        waker_cause: 0,
                        sleeper_tgid: 100,
                        waker_tgid: 200,
                        link: latprof_common::CHAIN_RAN,
                        pad: 0,
                    },
                    count: i,
                    total_ns: 2_000_000 * i,
                    behind_ns: 0,
                    runq_ns: 0,
                    comm: "waker".into(),
                },
            ];
            s.chains.retain(|c| c.count > 0);
            // User backtraces (format 7): the sleeper's from the start, named from the second
            // snapshot on (the collector names them on another thread); the fsyncer's cut
            // short.
            s.user_parts.insert(1, 0x5eed_0001);
            if i >= 1 {
                s.user_stacks.insert(0x5eed_0001, server_frames());
            }
            if s.stacks.contains_key(&2) {
                s.user_parts.insert(2, 0x5eed_0002);
                s.user_stacks.insert(0x5eed_0002, fsyncer_frames());
            }
            s.programs = vec![("sched_switch".into(), 1000 * i, 10 * i)];
            s.ticks = vec![
                [250 * i; TICK_COUNTER_COUNT as usize],
                [3 * i; TICK_COUNTER_COUNT as usize],
            ];
            s
        })
        .collect()
}

fn user_frame(name: &str, module: &str, offset: u64) -> crate::ustacks::UserFrame {
    crate::ustacks::UserFrame {
        name: name.into(),
        module: module.into(),
        build_id: if module.is_empty() {
            String::new()
        } else {
            format!("{:040x}", module.len())
        },
        offset,
        named: !name.contains("+0x"),
        // Format 9 on: the function's entry line.
        start_line: if name.contains("+0x") {
            0
        } else {
            u32::try_from(offset % 1000).unwrap() + 1
        },
    }
}

/// A user backtrace, innermost first: libc, the program, and a frame with no symbol.
pub fn server_frames() -> Vec<crate::ustacks::UserFrame> {
    vec![
        user_frame(
            "__GI___libc_read",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            0x11_ba61,
        ),
        user_frame("wait_for_request", "/tmp/r/server", 0x1189),
        user_frame("serve_requests", "/tmp/r/server", 0x11d4),
        user_frame("server+0x1f00", "/tmp/r/server", 0x1f00),
        user_frame("main", "/tmp/r/server", 0x1230),
        user_frame(
            "__libc_start_call_main",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            0x2_a1ca,
        ),
    ]
}

/// A user backtrace cut short (a program without frame pointers).
pub fn fsyncer_frames() -> Vec<crate::ustacks::UserFrame> {
    vec![
        user_frame(
            "fdatasync",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            0x11_e0a0,
        ),
        user_frame("[anon]+0x7f00dead0000", "", 0x7f00_dead_0000),
        crate::ustacks::UserFrame::truncated(),
    ]
}

/// `snap` with every backtrace id and frame replaced by what its symbols name (a hash of the
/// names and offsets): what a recording must keep, since it writes neither the ids nor the
/// addresses themselves.
pub fn named(snap: &Snapshot, syms: &Kallsyms) -> Snapshot {
    use std::hash::{DefaultHasher, Hash as _, Hasher as _};
    let frame = |ip: u64| {
        let mut h = DefaultHasher::new();
        syms.entry(ip)
            .map(|(at, name)| (name, ip - at))
            .hash(&mut h);
        h.finish()
    };
    let id = |id: u64| {
        if id >= latprof_common::RESERVED_STACKS {
            return id;
        }
        let mut h = DefaultHasher::new();
        snap.stacks[&id]
            .iter()
            .map(|ip| frame(*ip))
            .collect::<Vec<_>>()
            .hash(&mut h);
        h.finish()
    };
    let mut out = snap.clone();
    out.stacks = snap
        .stacks
        .iter()
        .map(|(k, frames)| (id(*k), frames.iter().map(|ip| frame(*ip)).collect()))
        .collect();
    for t in &mut out.tasks {
        for r in &mut t.records {
            r.stack_id = id(r.stack_id);
        }
    }
    for (k, _) in &mut out.global {
        *k = id(*k);
    }
    out.global.sort_unstable_by_key(|(k, _)| *k);
    for (k, _) in &mut out.cgroups {
        k.stack_id = id(k.stack_id);
    }
    out.cgroups.sort_unstable_by_key(|(k, _)| *k);
    out.exited = std::sync::Arc::new(
        snap.exited
            .iter()
            .map(|(k, r)| {
                let mut k = *k;
                k.stack_id = id(k.stack_id);
                (k, *r)
            })
            .collect(),
    );
    out.histograms = snap.histograms.iter().map(|(k, h)| (id(*k), *h)).collect();
    for w in &mut out.wakers {
        w.key.cause = id(w.key.cause);
        if w.key.waker_stack != 0 {
            w.key.waker_stack = id(w.key.waker_stack);
        }
    }
    out.wakers.sort_unstable_by_key(|w| w.key);
    for c in &mut out.chains {
        c.key.cause = id(c.key.cause);
        if c.key.waker_cause != 0 {
            c.key.waker_cause = id(c.key.waker_cause);
        }
    }
    out.chains.sort_unstable_by_key(|c| c.key);
    // User backtrace ids by their frames (u64::MAX: not named yet).
    let user = |u: &u64| {
        snap.user_stacks.get(u).map_or(u64::MAX, |frames| {
            let mut h = DefaultHasher::new();
            frames.hash(&mut h);
            h.finish()
        })
    };
    out.user_parts = snap
        .user_parts
        .iter()
        .map(|(k, u)| (id(*k), user(u)))
        .collect();
    out.user_stacks = snap
        .user_stacks
        .iter()
        .map(|(u, frames)| (user(u), frames.clone()))
        .collect();
    out
}

pub fn record(snaps: &[Snapshot], options: Options) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!(
        "latprof-store-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.lpr");
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let mut w = Writer::create(&path, info(), options).unwrap();
    for s in snaps {
        w.append(s, &syms).unwrap();
    }
    w.finish("test").unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

#[test]
fn every_snapshot_comes_back_as_it_was_written() {
    let snaps = snapshots(150);
    for compress in [true, false] {
        let bytes = record(
            &snaps,
            Options {
                compress,
                ..Options::default()
            },
        );
        let r = Recording::from_bytes(bytes).unwrap();
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.end.as_deref(), Some("test"));
        let syms = Kallsyms::parse(KALLSYMS).unwrap();
        let (sched_text, lock_text) = syms.public_ranges();
        assert_eq!(
            r.info,
            RecordingInfo {
                sched_text,
                lock_text,
                ..info()
            }
        );
        assert_eq!(r.len(), snaps.len());
        // Forward, backward and jumping across key frames.
        for i in (0..snaps.len())
            .chain((0..snaps.len()).rev())
            .chain([3, 140, 61, 59, 0])
        {
            assert_eq!(
                named(&r.snapshot(i).unwrap(), &r.syms),
                named(&snaps[i], &syms),
                "snapshot {i}, compress {compress}"
            );
        }
        for ip in [
            0xffff_ffff_8120_0010,
            0xffff_ffff_c000_0042,
            0xffff_ffff_8140_0020,
        ] {
            assert_eq!(r.syms.name(syms.public_addr(ip)), syms.name(ip));
        }
    }
}

#[test]
fn deltas_and_compression_keep_the_file_small() {
    let snaps = snapshots(120);
    let packed = record(&snaps, Options::default()).len();
    let plain = record(
        &snaps,
        Options {
            compress: false,
            ..Options::default()
        },
    )
    .len();
    assert!(packed < plain, "{packed} >= {plain}");
    // Two key frames; the deltas carry only the changed task, histogram, wakers, chains and
    // counters (about 250 bytes each with the frame header), not the whole snapshot again.
    assert!(packed < 120 * 310, "{packed} bytes for 120 snapshots");
}

#[test]
fn a_cut_file_replays_up_to_its_last_whole_frame() {
    let snaps = snapshots(70);
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let bytes = record(&snaps, Options::default());
    // Every cut point: never a panic; the count of snapshots only grows with the length.
    let mut prev = 0;
    for cut in (FILE_HEADER_LEN..bytes.len())
        .step_by(3)
        .chain([bytes.len() - 1])
    {
        match Recording::from_bytes(bytes[..cut].to_vec()) {
            Ok(r) => {
                assert!(r.len() >= prev, "cut at {cut}");
                prev = r.len();
                assert!(r.end.is_none() || cut + 1 >= bytes.len() - 20);
                let i = r.len() - 1;
                assert_eq!(
                    named(&r.snapshot(i).unwrap(), &r.syms),
                    named(&snaps[i], &syms)
                );
            }
            Err(e) => assert!(matches!(e, FormatError::NoSnapshot(_)), "cut at {cut}: {e}"),
        }
    }
    // Only the end frame is missing at the last cut.
    assert_eq!(prev, 70);
}

#[test]
fn a_flipped_byte_costs_the_frames_up_to_the_next_key_frame() {
    let snaps = snapshots(130);
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let same = |r: &Recording, i: usize, j: usize| {
        assert_eq!(
            named(&r.snapshot(i).unwrap(), &r.syms),
            named(&snaps[j], &syms)
        );
    };
    let bytes = record(&snaps, Options::default());
    let r = Recording::from_bytes(bytes.clone()).unwrap();
    assert_eq!(r.len(), 130);
    // Damage the third delta frame (inside its payload).
    let mut frames = Vec::new();
    let mut pos = FILE_HEADER_LEN;
    while pos + FRAME_HEADER_LEN <= bytes.len() {
        frames.push(pos);
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
        pos += FRAME_HEADER_LEN + len;
    }
    let mut bad = bytes.clone();
    bad[frames[3] + FRAME_HEADER_LEN + 2] ^= 0x10;
    let r = Recording::from_bytes(bad).unwrap();
    // Snapshots 0..3 stay, 3..60 are lost, 60.. come back from the next key frame.
    assert_eq!(r.len(), 3 + 70);
    same(&r, 3, 60);
    same(&r, r.len() - 1, 129);
    assert!(
        r.problems.iter().any(|p| p.contains("checksum")),
        "{:?}",
        r.problems
    );
    // A damaged length field: the reader finds the next frame mark.
    let mut bad = bytes.clone();
    bad[frames[5] + 5] ^= 0x40;
    let r = Recording::from_bytes(bad).unwrap();
    assert_eq!(r.len(), 5 + 70);
    same(&r, 5, 60);
}

#[test]
fn spike_frames_come_back_in_time_order() {
    let dir = std::env::temp_dir().join(format!("latprof-spikes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.lpr");
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let mut w = Writer::create(&path, info(), Options::default()).unwrap();
    let snaps = snapshots(5);
    let spike = |end_ns: u64| crate::collect::Spike {
        end_ns,
        duration_ns: 12_000_000,
        stack_id: 1,
        tid: 100,
        tgid: 100,
        cpu: 1,
        kind: latprof_common::SPIKE_SLEEP_INTERRUPTIBLE,
        comm: "sleeper".into(),
        waker_kind: latprof_common::WAKER_TASK,
        waker_tgid: 200,
        waker_tid: 201,
        waker_comm: "waker".into(),
    };
    for (i, s) in snaps.iter().enumerate() {
        let t = s.taken_ns;
        w.append_spikes(&[spike(t - 100), spike(t - 500)], 10 * i as u64, 0)
            .unwrap();
        w.append(s, &syms).unwrap();
    }
    w.finish("test").unwrap();
    let r = Recording::open(&path).unwrap();
    assert_eq!(r.len(), 5);
    assert_eq!(r.spikes.len(), 10);
    let (upto, sleeps) = r.spikes_until(snaps[2].taken_ns, 200);
    assert_eq!(upto.len(), 6);
    assert_eq!(sleeps, 20);
    let (last, _) = r.spikes_until(snaps[4].taken_ns, 3);
    assert_eq!(last.len(), 3);
    // The spike names the backtrace the snapshot names (both written through the same key).
    let id = r.snapshot(4).unwrap().tasks[0].records[0].stack_id;
    assert_ne!(id, 1);
    assert_eq!(
        last[2],
        crate::collect::Spike {
            stack_id: id,
            ..spike(snaps[4].taken_ns - 100)
        }
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Version 1 recordings (no tick counters) are still read.
#[test]
fn version_1_is_still_read() {
    let snaps = snapshots(3);
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&[0, 0]);
    // Key frames only: each holds its whole snapshot.
    for snap in &snaps {
        let mut e = Enc::default();
        info().encode(&mut e, 1);
        writer_body(snap).encode(&mut e, 1);
        bytes.extend_from_slice(&writer::frame(KIND_KEY, &e.buf, true));
    }
    let r = Recording::from_bytes(bytes).unwrap();
    assert_eq!(r.version, 1);
    assert_eq!(r.len(), 3);
    assert_eq!(r.info.kernel, crate::probe::KernelFacts::default());
    assert_eq!(r.info.hostname, info().hostname);
    let mut expect = snaps[2].clone();
    expect.ticks.clear();
    expect.chains.clear();
    without_cgroups(&mut expect);
    assert_eq!(r.snapshot(2).unwrap(), expect);
}

/// Version 6 recordings (wakers, no user backtraces) are still read: no user frames.
#[test]
fn version_6_is_still_read() {
    let snaps = snapshots(3);
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&6u16.to_le_bytes());
    bytes.extend_from_slice(&[0, 0]);
    for snap in &snaps {
        let mut e = Enc::default();
        info().encode(&mut e, 6);
        writer_body(snap).encode(&mut e, 6);
        bytes.extend_from_slice(&writer::frame(KIND_KEY, &e.buf, true));
    }
    let r = Recording::from_bytes(bytes).unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.version, 6);
    assert_eq!(r.len(), 3);
    assert!(r.info.wakers && !r.info.user_stacks);
    let mut expect = snaps[2].clone();
    without_user_stacks(&mut expect);
    expect.chains.clear();
    expect.wakers.sort_unstable_by_key(|w| w.key);
    assert_eq!(r.snapshot(2).unwrap(), expect);
}

/// User backtraces come back as they were named at record time (file, build id, offset,
/// whether named, the mark of one cut short), without the binaries; each is written once, when
/// first named, and again in each key frame, not with every snapshot.
#[test]
fn user_frames_come_back_as_named_at_record_time() {
    let snaps = snapshots(130);
    let bytes = record(
        &snaps,
        Options {
            compress: false,
            ..Options::default()
        },
    );
    let r = Recording::from_bytes(bytes.clone()).unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.info.user_stacks);
    // The sleeper's record: its user part is known at once, its frames are not named yet.
    let first = r.snapshot(0).unwrap();
    let sleeper = first.tasks[0].records[0].stack_id;
    assert_eq!(first.user_parts.len(), 1);
    assert!(first.user_stacks.is_empty());
    assert_eq!(
        crate::model::user_names(&crate::model::user_frames(&first, sleeper, 12)),
        [crate::model::NOT_NAMED_YET]
    );
    for i in [1, 2, 4, 59, 60, 61, 100, 129] {
        let s = r.snapshot(i).unwrap();
        assert_eq!(
            s.user_stacks[&s.user_parts[&sleeper]],
            server_frames(),
            "snapshot {i}"
        );
        assert_eq!(
            crate::model::user_names(&crate::model::user_frames(&s, sleeper, 3)),
            ["__GI___libc_read", "wait_for_request", "serve_requests"]
        );
        // The fsyncer's, cut short: the mark survives.
        let others: Vec<_> = s
            .user_parts
            .iter()
            .filter(|(id, _)| **id != sleeper)
            .map(|(_, user)| &s.user_stacks[user])
            .collect();
        assert_eq!(others, [&fsyncer_frames()], "snapshot {i}");
        assert!(others[0].last().unwrap().is_truncated());
        // The global table's causes carry them (the fsyncer's from the third snapshot on).
        let causes = crate::model::global_causes(&s, &r.syms, 12);
        assert!(
            i < 2
                || causes.iter().any(|c| c
                    .user
                    .last()
                    .is_some_and(crate::ustacks::UserFrame::is_truncated)),
            "snapshot {i}: {causes:?}"
        );
    }
    // Snapshot 1 named both (a delta frame), key frames 60 and 120 again: three times each,
    // and each file's path once per frame that holds its backtraces.
    let times = |needle: &str| {
        bytes
            .windows(needle.len())
            .filter(|w| *w == needle.as_bytes())
            .count()
    };
    assert_eq!(times("wait_for_request"), 3);
    assert_eq!(times("fdatasync"), 3);
    assert_eq!(times("/tmp/r/server"), 3);
}

/// A file name shared by many frames is copied into each: a hostile frame with one long name
/// and many frames naming it runs out of budget instead of memory.
#[test]
fn a_long_file_name_shared_by_many_frames_is_charged_for_each_copy() {
    let module = "/x".repeat(20_000);
    // As many frames as latprof takes (more are damage: see below).
    let frames = (0..super::MAX_USER_FRAMES as u64)
        .map(|offset| crate::ustacks::UserFrame {
            name: String::new(),
            module: module.clone(),
            build_id: String::new(),
            offset,
            named: false,
            start_line: 0,
        })
        .collect();
    let body = Body {
        user_stacks: vec![(1, frames)],
        ..Body::default()
    };
    let mut e = Enc::default();
    body.encode(&mut e, VERSION);
    // About 41 KB on disk for 7.7 MB once decoded.
    assert!(e.buf.len() < 45_000, "{}", e.buf.len());
    assert_eq!(
        Body::decode(&mut Dec::with_budget(&e.buf, 4 << 20), VERSION),
        Err(FormatError::TooBig)
    );
    assert_eq!(
        Body::decode(&mut Dec::new(&e.buf), VERSION),
        Ok(body.clone())
    );
    // One frame more than latprof takes is damage, however much budget is left.
    let mut longer = body;
    let extra = longer.user_stacks[0].1[0].clone();
    longer.user_stacks[0].1.push(extra);
    let mut e = Enc::default();
    longer.encode(&mut e, VERSION);
    assert!(matches!(
        Body::decode(&mut Dec::new(&e.buf), VERSION),
        Err(FormatError::Malformed(_))
    ));
}

/// `snap` as a recording before format 5 keeps it: no cgroups.
fn without_cgroups(snap: &mut Snapshot) {
    without_wakers(snap);
    snap.cgroups.clear();
    snap.cgroup_paths.clear();
    for t in &mut snap.tasks {
        for r in &mut t.records {
            r.cgroup = 0;
        }
    }
}

/// `snap` as a recording before format 6 keeps it: no wakers, nor the backtraces only they
/// named.
fn without_wakers(snap: &mut Snapshot) {
    without_user_stacks(snap);
    snap.wakers.clear();
    snap.stacks.remove(&3);
}

/// `snap` as a recording before format 7 keeps it: no user backtraces (nor, before 9, the
/// exited tasks' sums).
fn without_user_stacks(snap: &mut Snapshot) {
    snap.exited = std::sync::Arc::default();
    snap.user_parts.clear();
    snap.user_stacks.clear();
}

/// A whole snapshot as a frame body (a key frame's).
fn writer_body(snap: &Snapshot) -> Body {
    Body {
        taken_ns: snap.taken_ns,
        wall_ns: snap.wall_ns,
        stacks: snap.stacks.iter().map(|(k, v)| (*k, v.clone())).collect(),
        syms: Vec::new(),
        mode: snap.mode,
        skip_kthreads: snap.skip_kthreads,
        retries: snap.retries,
        counters: counter_values(&snap.counters),
        programs: snap.programs.clone(),
        tasks_gone: Vec::new(),
        tasks: snap.tasks.clone(),
        global_gone: Vec::new(),
        global: snap.global.clone(),
        hist_gone: Vec::new(),
        histograms: snap.histograms.iter().map(|(k, v)| (*k, *v)).collect(),
        ticks: snap.ticks.clone(),
        cgroup_gone: Vec::new(),
        cgroups: snap.cgroups.clone(),
        paths_gone: Vec::new(),
        paths: snap
            .cgroup_paths
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect(),
        wakers_gone: Vec::new(),
        wakers: snap.wakers.clone(),
        user_parts: snap.user_parts.iter().map(|(k, v)| (*k, *v)).collect(),
        user_stacks: snap
            .user_stacks
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect(),
        exited_gone: Vec::new(),
        exited: snap.exited.iter().map(|(k, v)| (*k, *v)).collect(),
        chains_gone: Vec::new(),
        chains: snap.chains.clone(),
    }
}

#[test]
fn bad_files_are_refused_with_one_line() {
    let msg = |bytes: Vec<u8>| Recording::from_bytes(bytes).err().unwrap().to_string();
    assert_eq!(msg(Vec::new()), "empty file, not a latprof recording");
    assert!(msg(b"Latency Top version : v0.1\n".to_vec()).starts_with("not a latprof recording"));
    let mut future = record(&snapshots(2), Options::default());
    future[8] = 11;
    assert_eq!(
        msg(future),
        format!(
            "recording format version 11 is newer than this latprof reads (up to {VERSION}); use a newer latprof"
        )
    );
    let mut only_header = MAGIC.to_vec();
    only_header.extend_from_slice(&[2, 0, 0, 0]);
    assert!(msg(only_header).starts_with("the recording holds no complete snapshot"));
    assert_ne!(msg(MAGIC[..4].to_vec()), "");
}

/// Every snapshot past the limit (here: each one) rotates, the last one too: the file the
/// recording finishes in still holds the last snapshot and the reason it ended.
#[test]
fn the_last_file_of_a_rotation_holds_the_last_snapshot() {
    let dir = std::env::temp_dir().join(format!("latprof-rotate-last-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.lpr");
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let options = Options {
        rotate: Some(1),
        keep: 2,
        ..Options::default()
    };
    let mut w = Writer::create(&path, info(), options).unwrap();
    let snaps = snapshots(5);
    for s in &snaps {
        assert_eq!(w.append(s, &syms).unwrap(), writer::Appended::Written);
    }
    w.finish("test").unwrap();
    for (name, n) in [("run.lpr", 4), ("run.lpr.1", 3), ("run.lpr.2", 2)] {
        let rec = Recording::open(&dir.join(name)).unwrap();
        assert_eq!(rec.len(), 1, "{name}");
        assert_eq!(
            named(&rec.snapshot(0).unwrap(), &rec.syms),
            named(&snaps[n], &syms),
            "{name}"
        );
        let end = if n == 4 { "test" } else { "rotated" };
        assert_eq!(rec.end.as_deref(), Some(end), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rotation_keeps_a_bounded_set_of_complete_files() {
    let dir = std::env::temp_dir().join(format!("latprof-rotate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.lpr");
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let options = Options {
        rotate: Some(2000),
        keep: 2,
        ..Options::default()
    };
    let mut w = Writer::create(&path, info(), options).unwrap();
    let snaps = snapshots(300);
    for s in &snaps {
        assert_eq!(w.append(s, &syms).unwrap(), writer::Appended::Written);
    }
    let stats = w.finish("test").unwrap();
    assert!(stats.rotations >= 3, "{stats:?}");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["run.lpr", "run.lpr.1", "run.lpr.2"]);
    // Each file opens on its own and ends where the next begins.
    let newest = Recording::open(&path).unwrap();
    let older = Recording::open(&dir.join("run.lpr.1")).unwrap();
    assert_eq!(older.end.as_deref(), Some("rotated"));
    assert_eq!(
        named(&newest.snapshot(newest.len() - 1).unwrap(), &newest.syms),
        named(&snaps[299], &syms)
    );
    assert_eq!(
        named(&older.snapshot(older.len() - 1).unwrap(), &older.syms),
        named(&snaps[299 - newest.len()], &syms)
    );
    for name in &names {
        assert!(std::fs::metadata(dir.join(name)).unwrap().len() < 4000);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn max_size_stops_before_the_limit() {
    let dir = std::env::temp_dir().join(format!("latprof-maxsize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.lpr");
    let syms = Kallsyms::parse(KALLSYMS).unwrap();
    let options = Options {
        // The first frames hold the user backtraces too (format 7).
        max_size: Some(4000),
        ..Options::default()
    };
    let mut w = Writer::create(&path, info(), options).unwrap();
    let mut written = 0;
    for s in &snapshots(300) {
        if w.append(s, &syms).unwrap() == writer::Appended::Full {
            break;
        }
        written += 1;
    }
    w.finish("size limit").unwrap();
    assert!(written > 10 && written < 300, "{written}");
    assert!(std::fs::metadata(&path).unwrap().len() <= 4000);
    let r = Recording::open(&path).unwrap();
    assert_eq!(r.len(), written);
    assert_eq!(r.end.as_deref(), Some("size limit"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The reader against arbitrary bytes and against real recordings with bytes flipped, cut,
/// inserted or removed: it returns an error or what is intact, never panics, and every
/// snapshot it offers can be rebuilt.
mod fuzz {
    use proptest::prelude::*;

    use super::super::{
        KIND_KEY, MAGIC, VERSION,
        codec::Enc,
        reader::{MEMORY_FLOOR, MEMORY_PER_BYTE, Recording},
        tests,
        writer::{Options, frame},
    };

    /// Reads `bytes` as a recording and rebuilds every snapshot it offers, within bounds: heap
    /// at its peak under three times the reader's memory limit for the file's size (the
    /// decoded frame, the items decoded from it, which a growing vector may hold twice over),
    /// and a few seconds of this thread's CPU.
    fn exercise(bytes: Vec<u8>) {
        let len = bytes.len() as u64;
        let cpu = thread_cpu_s();
        let ((), peak) = counting::peak_during(|| {
            if let Ok(r) = Recording::from_bytes(bytes) {
                assert!(!r.is_empty());
                for i in 0..r.len() {
                    let _ = r.snapshot(i).unwrap();
                }
                let _ = r.find("+1s");
                let _ = r.find("12:00");
            }
        });
        let limit = len + 3 * (MEMORY_FLOOR + MEMORY_PER_BYTE * len);
        assert!(
            peak <= limit,
            "peak heap {peak} bytes for a {len}-byte file"
        );
        let cpu = thread_cpu_s() - cpu;
        assert!(cpu < 5.0, "{cpu} s of CPU for a {len}-byte file");
    }

    fn thread_cpu_s() -> f64 {
        // SAFETY: all-zero is a valid rusage; getrusage fills it.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a live local.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut u) };
        #[expect(clippy::cast_precision_loss, reason = "seconds")]
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        secs(u.ru_utime) + secs(u.ru_stime)
    }

    /// The test binary's allocator counts each thread's heap, so that a case measures its own
    /// peak while other tests run beside it.
    mod counting {
        use std::{
            alloc::{GlobalAlloc, Layout, System},
            cell::Cell,
        };

        struct Counting;

        thread_local! {
            static NOW: Cell<u64> = const { Cell::new(0) };
            static PEAK: Cell<u64> = const { Cell::new(0) };
        }

        fn grow(by: u64) {
            let _ = NOW.try_with(|now| {
                let v = now.get() + by;
                now.set(v);
                let _ = PEAK.try_with(|peak| peak.set(peak.get().max(v)));
            });
        }

        fn shrink(by: u64) {
            let _ = NOW.try_with(|now| now.set(now.get().saturating_sub(by)));
        }

        // SAFETY: every call goes to System unchanged; only the counts are added.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                // SAFETY: the caller's contract, passed on.
                let p = unsafe { System.alloc(layout) };
                if !p.is_null() {
                    grow(layout.size() as u64);
                }
                p
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                shrink(layout.size() as u64);
                // SAFETY: the caller's contract, passed on.
                unsafe { System.dealloc(ptr, layout) };
            }

            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
                // SAFETY: the caller's contract, passed on.
                let p = unsafe { System.realloc(ptr, layout, new) };
                if !p.is_null() {
                    shrink(layout.size() as u64);
                    grow(new as u64);
                }
                p
            }
        }

        #[global_allocator]
        static ALLOC: Counting = Counting;

        /// `f`'s result and the most heap this thread held during it beyond what it held before.
        pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, u64) {
            let start = NOW.with(Cell::get);
            PEAK.with(|p| p.set(start));
            let r = f();
            (r, PEAK.with(Cell::get) - start)
        }
    }

    fn recording() -> &'static [u8] {
        static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        BYTES.get_or_init(|| tests::record(&tests::snapshots(70), Options::default()))
    }

    fn plain_recording() -> &'static [u8] {
        static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        BYTES.get_or_init(|| {
            tests::record(
                &tests::snapshots(20),
                Options {
                    compress: false,
                    ..Options::default()
                },
            )
        })
    }

    #[derive(Clone, Debug)]
    enum Edit {
        Flip(usize, u8),
        Cut(usize),
        Insert(usize, Vec<u8>),
        Remove(usize, usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), 1..=255u8).prop_map(|(at, bits)| Edit::Flip(at, bits)),
            any::<usize>().prop_map(Edit::Cut),
            (
                any::<usize>(),
                proptest::collection::vec(any::<u8>(), 1..64)
            )
                .prop_map(|(at, b)| Edit::Insert(at, b)),
            (any::<usize>(), 1..200usize).prop_map(|(at, n)| Edit::Remove(at, n)),
        ]
    }

    fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
        for e in edits {
            let len = bytes.len().max(1);
            match e {
                Edit::Flip(at, bits) => {
                    if let Some(b) = bytes.get_mut(at % len) {
                        *b ^= bits;
                    }
                }
                Edit::Cut(at) => bytes.truncate(at % len),
                Edit::Insert(at, b) => {
                    let at = at % len.min(bytes.len() + 1);
                    bytes.splice(at..at, b.iter().copied());
                }
                Edit::Remove(at, n) => {
                    let at = (at % len).min(bytes.len());
                    let end = (at + n).min(bytes.len());
                    bytes.drain(at..end);
                }
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes(tail in proptest::collection::vec(any::<u8>(), 0..4096), header in any::<bool>()) {
            let mut bytes = Vec::new();
            if header {
                bytes.extend_from_slice(&MAGIC);
                bytes.extend_from_slice(&VERSION.to_le_bytes());
                bytes.extend_from_slice(&[0, 0]);
            }
            bytes.extend_from_slice(&tail);
            exercise(bytes);
        }

        #[test]
        fn mutated_recordings(edits in proptest::collection::vec(edit(), 1..6)) {
            exercise(apply(recording().to_vec(), &edits));
        }

        #[test]
        fn checksummed_garbage_frames(
            frames in proptest::collection::vec(
                (1..=4u8, proptest::collection::vec(any::<u8>(), 0..512), any::<bool>()),
                1..8,
            ),
        ) {
            // Frames with valid checksums but arbitrary contents, after a real recording.
            let mut bytes = plain_recording().to_vec();
            for (kind, payload, compress) in &frames {
                bytes.extend_from_slice(&super::writer::frame(*kind, payload, *compress));
            }
            exercise(bytes);
        }

        #[test]
        fn mutated_uncompressed_recordings(edits in proptest::collection::vec(edit(), 1..6)) {
            // Without compression a flipped byte lands in the encoded snapshot itself.
            exercise(apply(plain_recording().to_vec(), &edits));
        }
    }

    proptest! {
        // Each case compresses up to 32 MiB: fewer cases.
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Bombs: a key frame whose counts declare far more items than its bytes hold once
        /// decoded (symbols or backtraces), and frames of zeros that inflate a thousandfold.
        #[test]
        fn bombs(
            count in 1u64..=u64::from(u32::MAX),
            exact in any::<bool>(),
            filler in 0usize..(32 << 20),
            symbols in any::<bool>(),
            zeros in proptest::collection::vec(0usize..(16 << 20), 0..4),
            after_a_recording in any::<bool>(),
        ) {
            // After a whole recording, or alone: a bomb that is the first key frame must not
            // leave facts without a snapshot.
            let mut bytes = if after_a_recording {
                plain_recording().to_vec()
            } else {
                plain_recording()[..super::FILE_HEADER_LEN].to_vec()
            };
            let mut e = Enc::default();
            tests::info().encode(&mut e, VERSION);
            e.u64(1);
            e.u64(1);
            if symbols {
                e.usize(0);
            }
            // Exactly as many two-byte items as the filler holds, or any count.
            e.u64(if exact { filler as u64 / 2 } else { count });
            e.buf.resize(e.buf.len() + filler, 0);
            bytes.extend_from_slice(&frame(KIND_KEY, &e.buf, true));
            for n in zeros {
                bytes.extend_from_slice(&frame(KIND_KEY, &vec![0; n], true));
            }
            exercise(bytes);
        }
    }
}

/// A recording is shared with people who may not read /proc/kallsyms: no kernel address in it,
/// and backtrace ids that are not the kernel side's (hashes of raw addresses).
#[test]
fn a_recording_holds_no_kernel_address() {
    let snaps = snapshots(70);
    let bytes = record(&snaps, Options::default());
    let kernel = 0xffff_ffff_8000_0000..0xffff_ffff_c100_0000;
    let leaked: Vec<_> = numbers_in(&bytes)
        .unwrap()
        .into_iter()
        .filter(|v| kernel.contains(v))
        .collect();
    assert!(leaked.is_empty(), "{leaked:x?}");
    let r = Recording::from_bytes(bytes).unwrap();
    let ids: Vec<u64> = r.snapshot(69).unwrap().stacks.keys().copied().collect();
    assert_eq!(ids.len(), 3);
    assert!(
        !ids.contains(&1) && !ids.contains(&2) && !ids.contains(&3),
        "{ids:?}"
    );
}

/// N8: the views of a snapshot are charged what they will name, at the depth they show (the
/// longest frames counted: which ones a cause keeps is the view's to choose), once per record
/// that names it, against the reader's memory budget; over it, the snapshot is refused.
#[test]
fn views_are_charged_what_they_name() {
    let long = "x".repeat(1 << 20);
    let kallsyms =
        format!("ffffffff81000000 T _stext\nffffffff81200000 T {long}\nffffffff81300000 T short\n");
    let syms = Kallsyms::parse(&kallsyms).unwrap();
    let write = |snap: &Snapshot| -> Recording {
        let dir = std::env::temp_dir().join(format!(
            "latprof-store-views-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.lpr");
        let mut w = Writer::create(&path, info(), Options::default()).unwrap();
        w.append(snap, &syms).unwrap();
        w.finish("test").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        Recording::from_bytes(bytes).unwrap()
    };
    // One backtrace: the long symbol, then eleven short frames.
    let mut snap = Snapshot::default();
    let mut frames = vec![0xffff_ffff_8120_0010];
    frames.extend([0xffff_ffff_8130_0010; 11]);
    snap.stacks.insert(7, frames);
    let one = GlobalRecord {
        count: 1,
        total_ns: 1000,
        max_ns: 1000,
    };
    snap.global = vec![(7, one)];
    let mut r = write(&snap);
    let shown = r.snapshot(0).unwrap();
    let at_12 = r.view_bytes(&shown, &[]);
    r.set_depth(Some(1));
    let at_1 = r.view_bytes(&shown, &[]);
    let frame = |name: usize| (name + size_of::<String>()) as u64;
    assert_eq!(at_12 - at_1, 11 * frame("short".len()));
    assert!(at_1 >= frame(long.len()), "{at_1}");
    // A hundred processes' records naming it: 100 MiB of names, shown six times over.
    for tid in 1..=100 {
        snap.tasks.push(TaskSnapshot {
            tid,
            tgid: tid,
            comm: "p".into(),
            kthread: false,
            task_only: 0,
            records: vec![rec(7, 1)],
        });
    }
    let r = write(&snap);
    assert!(r.view_budget() < 100 << 20, "{}", r.view_budget());
    let err = format!("{:#}", r.snapshot(0).unwrap_err());
    assert!(
        err.starts_with("snapshot #0: showing it would take about "),
        "{err}"
    );
}
