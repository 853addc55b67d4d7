//! The container image (`cargo xtask image`: contrib/container/Containerfile, `FROM scratch`
//! with the static binary) run as the Kubernetes manifest contrib/kubernetes/latprof.yaml runs
//! it: the test reads the manifest and gives podman exactly its settings (privileged, the
//! host's pid and network namespaces), its mounts and its arguments. In the image, latprof
//! serves metrics with data and stops cleanly on SIGTERM, and counts a host workload's
//! sleeps exactly.
//!
//! Needs root, podman and runc, and the image (`cargo xtask test` installs them, builds it
//! and runs this).
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_yaml_ng::Value;

mod common;

use common::Workload;

const MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../contrib/kubernetes/latprof.yaml"
);

/// What the manifest asks of the container runtime for latprof's container.
struct Pod {
    image: String,
    args: Vec<String>,
    /// podman's options for the manifest's settings and mounts.
    options: Vec<String>,
}

/// Reads the manifest's pod: every setting it has must be one the test can give podman (an
/// added capability or mount the test did not run with fails here).
fn pod() -> Pod {
    let text = std::fs::read_to_string(MANIFEST).expect("the manifest");
    let doc: Value = serde_yaml_ng::from_str(&text).expect("the manifest is YAML");
    assert_eq!(doc["kind"].as_str(), Some("DaemonSet"));
    let spec = &doc["spec"]["template"]["spec"];
    let mut options = Vec::new();
    for (key, value) in spec.as_mapping().expect("pod spec") {
        let key = key.as_str().expect("a key");
        match key {
            "hostPID" => {
                assert_eq!(value.as_bool(), Some(true));
                options.push("--pid=host".to_owned());
            }
            "hostNetwork" => {
                assert_eq!(value.as_bool(), Some(true));
                options.push("--network=host".to_owned());
            }
            // Scheduling only: nothing for one machine's runtime.
            "containers" | "volumes" | "tolerations" => {}
            other => panic!("the test does not run the pod setting {other}: add it here"),
        }
    }
    let containers = spec["containers"].as_sequence().expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    let container = &containers[0];
    let strings = |v: &Value| -> Vec<String> {
        v.as_sequence()
            .expect("a list")
            .iter()
            .map(|s| s.as_str().expect("a string").to_owned())
            .collect()
    };
    for (key, value) in container["securityContext"]
        .as_mapping()
        .expect("securityContext")
    {
        match key.as_str().expect("a key") {
            "privileged" => {
                assert_eq!(value.as_bool(), Some(true));
                options.push("--privileged".to_owned());
            }
            other => panic!("the test does not run the securityContext setting {other}"),
        }
    }
    let volumes = spec["volumes"].as_sequence().expect("volumes");
    for mount in container["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
    {
        let name = mount["name"].as_str().expect("a mount's name");
        let volume = volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"));
        let host = volume["hostPath"]["path"]
            .as_str()
            .expect("a hostPath volume");
        let at = mount["mountPath"].as_str().expect("mountPath");
        let ro = if mount["readOnly"].as_bool() == Some(true) {
            ":ro"
        } else {
            ""
        };
        assert!(Path::new(host).exists(), "{host} is not on this machine");
        options.push(format!("--volume={host}:{at}{ro}"));
    }
    Pod {
        image: container["image"].as_str().expect("image").to_owned(),
        args: strings(&container["args"]),
        options,
    }
}

/// `podman run` of the pod's image with its settings, then `args`. This machine's own needs
/// come first: runc (crun refuses a host whose cgroups are hybrid), and resource limits no
/// higher than a container may set here (its root lacks CAP_SYS_RESOURCE, and podman's
/// default limits are above this machine's).
fn podman(pod: &Pod, args: &[String]) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["run", "--rm", "--runtime=runc", "--pull=never"])
        .arg(format!("--ulimit=nofile={0}:{0}", nofile()))
        .arg("--ulimit=nproc=4096:4096")
        .args(&pod.options)
        .arg(&pod.image)
        .args(args);
    cmd
}

/// This process's descriptor limit (hard): the container's may be that high.
fn nofile() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) },
        0
    );
    limit.rlim_max.min(1 << 20)
}

fn ready() -> Pod {
    latprof::probe::check_privileges().expect("this test needs root: run `cargo xtask test`");
    let pod = pod();
    assert_eq!(
        pod.image,
        format!("localhost/latprof:{}", env!("CARGO_PKG_VERSION")),
        "the manifest names another image than this version's"
    );
    let exists = Command::new("podman")
        .args(["image", "exists", &pod.image])
        .status()
        .expect("podman (cargo xtask test installs it)");
    assert!(
        exists.success(),
        "{} is missing: `cargo xtask image` builds it (`cargo xtask test` does)",
        pod.image
    );
    pod
}

/// The image with the manifest's arguments (`serve`): /metrics answers with the sleeps it
/// counted, and SIGTERM stops it with exit status 0.
#[test]
#[ignore = "needs root, podman and the image: run `cargo xtask test`"]
fn serves_metrics_as_the_manifest_runs_it() {
    let pod = ready();
    let listen = pod
        .args
        .windows(2)
        .find_map(|w| (w[0] == "--listen").then(|| w[1].clone()))
        .expect("the manifest's serve --listen");
    let port = listen.rsplit(':').next().expect("a port");
    let mut child = podman(&pod, &pod.args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
    // Sleeps to count: a workload of this test's own.
    let mut work = Workload::spawn(&["sleep", "--count", "50", "--interval", "2ms"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let answer = TcpStream::connect(format!("127.0.0.1:{port}"))
            .ok()
            .and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
                s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
                    .ok()?;
                let mut text = String::new();
                s.read_to_string(&mut text).ok()?;
                Some(text)
            });
        if let Some(text) = answer
            && text.contains("\nlatprof_sleeps_total{")
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no metrics with data on port {port} within 60 s"
        );
        if child.try_wait().expect("podman").is_some() {
            let out = child.wait_with_output().expect("podman");
            panic!(
                "the container ended: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The first read of the tables is published about a second after attaching.
        std::thread::sleep(Duration::from_millis(200));
    };
    work.go();
    work.wait_fact("slept");
    work.release();
    assert_eq!(metrics.split_whitespace().nth(1), Some("200"), "{metrics}");
    // podman passes SIGTERM on to latprof, whose exit status becomes podman's.
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().expect("podman");
    assert!(
        out.status.success(),
        "latprof in the container exit {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image with the manifest's settings and mounts counts a host workload's sleeps exactly,
/// by the workload's host pid.
#[test]
#[ignore = "needs root, podman and the image: run `cargo xtask test`"]
fn counts_a_host_workload_exactly() {
    let pod = ready();
    // Every sleep, however long a loaded machine makes it: the count is then exact. podman
    // passes SIGINT on to latprof.
    let run = common::count_nanosleeps("100", "2ms", |pid| {
        podman(
            &pod,
            &["stats", "--all-sleeps", "--pid", pid, "--format", "json"].map(str::to_owned),
        )
    });
    if let Err(why) = common::exact_count(run.counted, run.slept, run.missing) {
        panic!("the workload's sleeps: {why}\n{}", run.stderr);
    }
}
