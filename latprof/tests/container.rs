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

use serde::Deserialize as _;
use serde_yaml_ng::Value;

mod common;

const MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../contrib/kubernetes/latprof.yaml"
);

/// What the manifest asks of the container runtime for latprof's container.
struct Pod {
    image: String,
    /// Its arguments, with `$(POD_IP)` where the manifest has it.
    args: Vec<String>,
    /// podman's options for the manifest's settings, limits and mounts.
    options: Vec<String>,
    /// The variable the manifest sets to the pod's address (`fieldRef: status.podIP`).
    ip_env: Option<String>,
}

/// The manifest's documents: the DaemonSet, and the NetworkPolicy for its port.
fn documents() -> Vec<Value> {
    let text = std::fs::read_to_string(MANIFEST).expect("the manifest");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("the manifest is YAML"))
        .collect()
}

/// Reads the manifest's pod: every setting it has must be one the test can give podman (an
/// added capability, limit or mount the test did not run with fails here).
fn pod() -> Pod {
    let docs = documents();
    let doc = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .expect("a DaemonSet");
    let spec = &doc["spec"]["template"]["spec"];
    let mut options = Vec::new();
    for (key, value) in spec.as_mapping().expect("pod spec") {
        let key = key.as_str().expect("a key");
        match key {
            "hostPID" => {
                assert_eq!(value.as_bool(), Some(true));
                options.push("--pid=host".to_owned());
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
    options.extend(security(&container["securityContext"], &strings));
    for (key, value) in container["resources"].as_mapping().expect("resources") {
        match key.as_str().expect("a key") {
            // What the scheduler reserves: nothing for one machine's runtime.
            "requests" => {}
            "limits" => {
                for (what, limit) in value.as_mapping().expect("limits") {
                    let limit = limit.as_str().expect("a quantity");
                    match what.as_str().expect("a key") {
                        "memory" => options.push(format!(
                            "--memory={}",
                            common::limits::bytes(limit, ["Ki", "Mi", "Gi", "Ti"])
                        )),
                        other => panic!("the test does not run the limit {other}"),
                    }
                }
            }
            other => panic!("the test does not run the resources setting {other}"),
        }
    }
    let mut ip_env = None;
    for var in container["env"]
        .as_sequence()
        .map_or(&[][..], Vec::as_slice)
    {
        let name = var["name"].as_str().expect("a variable's name").to_owned();
        match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("status.podIP") => ip_env = Some(name),
            other => panic!("the test does not give {name} the value {other:?}"),
        }
    }
    options.extend(mounts(spec, container));
    Pod {
        image: container["image"].as_str().expect("image").to_owned(),
        args: strings(&container["args"]),
        options,
        ip_env,
    }
}

/// podman's options for a container's securityContext. The manifest must not ask for a
/// privileged container.
fn security(context: &Value, strings: &impl Fn(&Value) -> Vec<String>) -> Vec<String> {
    let mut options = Vec::new();
    for (key, value) in context.as_mapping().expect("securityContext") {
        match key.as_str().expect("a key") {
            "capabilities" => {
                for (what, caps) in value.as_mapping().expect("capabilities") {
                    let caps = strings(caps).join(",").to_lowercase();
                    match what.as_str().expect("a key") {
                        "drop" => options.push(format!("--cap-drop={caps}")),
                        "add" => options.push(format!("--cap-add={caps}")),
                        other => panic!("capabilities: {other}"),
                    }
                }
            }
            "allowPrivilegeEscalation" => {
                assert_eq!(value.as_bool(), Some(false));
                options.push("--security-opt=no-new-privileges".to_owned());
            }
            "readOnlyRootFilesystem" => {
                assert_eq!(value.as_bool(), Some(true));
                options.push("--read-only".to_owned());
            }
            "seccompProfile" => {
                assert_eq!(value["type"].as_str(), Some("Unconfined"));
                options.push("--security-opt=seccomp=unconfined".to_owned());
            }
            other => panic!("the test does not run the securityContext setting {other}"),
        }
    }
    options
}

/// podman's `--volume` options for the container's mounts of hostPath volumes.
fn mounts(spec: &Value, container: &Value) -> Vec<String> {
    let volumes = spec["volumes"].as_sequence().expect("volumes");
    container["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .map(|mount| {
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
            format!("--volume={host}:{at}{ro}")
        })
        .collect()
}

/// An address for a pod of this test's own on podman's default network (the pod network of
/// this one-machine cluster): `ours` in 1..=200 picks which, the test's pid the rest.
fn pod_address(ours: u32) -> String {
    let out = Command::new("podman")
        .args(["network", "inspect", "podman", "--format"])
        .arg("{{range .Subnets}}{{.Subnet}} {{end}}")
        .output()
        .expect("podman network inspect");
    let subnets = String::from_utf8_lossy(&out.stdout).into_owned();
    let subnet = subnets
        .split_whitespace()
        .find(|s| s.contains('.'))
        .unwrap_or_else(|| panic!("no IPv4 subnet on podman's network: {subnets}"));
    let base: std::net::Ipv4Addr = subnet
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("subnet {subnet}"));
    let prefix: u32 = subnet
        .split('/')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(32);
    assert!(
        prefix <= 16,
        "podman's network {subnet} is smaller than the /16 the test picks addresses in"
    );
    let [a, b, ..] = base.octets();
    let third = std::process::id() % 200 + 20;
    format!("{a}.{b}.{third}.{ours}")
}

/// The test's container on `ip`, removed when dropped (a failed assertion included): a
/// container left running would keep its latprof attached under the tests after it.
struct Container(String);

impl Container {
    /// The name for the container on `ip`; one of that name left by an earlier run that was
    /// killed is removed first.
    fn on(ip: &str) -> Self {
        let name = container_name(ip);
        remove(&name);
        Self(name)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        remove(&self.0);
    }
}

fn remove(name: &str) {
    let _ = Command::new("podman")
        .args(["rm", "--force", "--ignore", "--time", "0", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `podman run` of the pod's image with its settings, then `args` (`$(POD_IP)` in them is the
/// pod's address, `ip`). This machine's own needs come first: runc (crun refuses a host
/// whose cgroups are hybrid), and resource limits no higher than a container may set here
/// (its root lacks CAP_SYS_RESOURCE, and podman's default limits are above this machine's).
fn podman(pod: &Pod, ip: &str, args: &[String]) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["run", "--rm", "--runtime=runc", "--pull=never"])
        .arg(format!("--ulimit=nofile={0}:{0}", nofile()))
        .arg("--ulimit=nproc=4096:4096")
        .args(&pod.options)
        .args(["--network=podman", &format!("--ip={ip}")])
        .arg(format!("--name={}", container_name(ip)));
    if let Some(name) = &pod.ip_env {
        cmd.arg(format!("--env={name}={ip}"));
    }
    // The defect `cargo xtask mutants` injects reaches the container's latprof as the host's.
    if let Ok(defect) = std::env::var("LATPROF_TEST_DEFECT") {
        cmd.arg(format!("--env=LATPROF_TEST_DEFECT={defect}"));
    }
    cmd.arg(&pod.image);
    let value = |a: &String| match &pod.ip_env {
        Some(name) => a.replace(&format!("$({name})"), ip),
        None => a.clone(),
    };
    cmd.args(args.iter().map(value));
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

/// The image with the manifest's arguments (`serve`) and settings: /metrics answers on the
/// pod's address with the sleeps it counted, latprof in the container has the three
/// capabilities and no other, cannot gain any, sees a read-only root and listens on the pod's
/// address alone; SIGTERM stops it with exit status 0.
#[test]
#[ignore = "needs root, podman and the image: run `cargo xtask test`"]
fn serves_metrics_as_the_manifest_runs_it() {
    let pod = ready();
    let ip = pod_address(1);
    let listen = pod
        .args
        .windows(2)
        .find_map(|w| (w[0] == "--listen").then(|| w[1].clone()))
        .expect("the manifest's serve --listen");
    let port = listen.rsplit(':').next().expect("a port").to_owned();
    let container = Container::on(&ip);
    let mut child = podman(&pod, &ip, &pod.args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let answer = TcpStream::connect(format!("{ip}:{port}"))
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
            "no metrics with data on {ip}:{port} within 60 s"
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
    assert_eq!(metrics.split_whitespace().nth(1), Some("200"), "{metrics}");
    confined(&host_pid(&container.0), &ip, &port);
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

/// The name of the test's container on `ip`.
fn container_name(ip: &str) -> String {
    format!("latprof-test-{}", ip.replace('.', "-"))
}

/// The host's pid of the container `name`'s first process (latprof: the image's entry point).
fn host_pid(name: &str) -> String {
    let out = Command::new("podman")
        .args(["inspect", "--format", "{{.State.Pid}}", name])
        .output()
        .expect("podman inspect");
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(pid.parse::<u32>().is_ok_and(|p| p > 0), "{out:?}");
    pid
}

/// What the kernel says of latprof in the container (host pid `pid`): CAP_BPF, CAP_PERFMON
/// and CAP_SYSLOG its only capabilities, in every set it could raise them from; no new
/// privileges; its root mounted read-only; its only listening socket on `ip:port`.
fn confined(pid: &str, ip: &str, port: &str) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("{key} in {status}"))
            .trim()
            .to_owned()
    };
    assert!(
        field("Name").starts_with("latprof"),
        "pid {pid} is not latprof: {status}"
    );
    // CAP_PERFMON 38, CAP_BPF 39, CAP_SYSLOG 34.
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(field(set), "000000c400000000", "{set}: {status}");
    }
    for set in ["CapInh", "CapAmb"] {
        assert_eq!(field(set), "0000000000000000", "{set}: {status}");
    }
    assert_eq!(field("NoNewPrivs"), "1", "{status}");
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("its mountinfo");
    let root = mountinfo
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .rfind(|f| f.len() > 5 && f[4] == "/")
        .unwrap_or_else(|| panic!("no root mount: {mountinfo}"));
    assert!(
        root[5].split(',').any(|o| o == "ro"),
        "its root is not read-only: {root:?}"
    );
    // /proc/PID/net/tcp (the container's network namespace): local address and port in
    // hex, state 0A for a listening socket.
    let want = {
        let [a, b, c, d] = ip.parse::<std::net::Ipv4Addr>().expect("ip").octets();
        let port: u16 = port.parse().expect("port");
        format!("{:08X}:{port:04X}", u32::from_le_bytes([a, b, c, d]))
    };
    let listening: Vec<String> = ["tcp", "tcp6"]
        .iter()
        .flat_map(|t| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{t}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.get(3) == Some(&"0A")).then(|| f[1].to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        listening,
        [want],
        "its listening sockets (want {ip}:{port})"
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
    let ip = pod_address(2);
    let _container = Container::on(&ip);
    let run = common::count_nanosleeps("100", "2ms", |pid| {
        podman(
            &pod,
            &ip,
            &["stats", "--all-sleeps", "--pid", pid, "--format", "json"].map(str::to_owned),
        )
    });
    if let Err(why) = common::exact_count(run.counted, run.slept, run.missing) {
        panic!("the workload's sleeps: {why}\n{}", run.stderr);
    }
}

/// The saved image (`cargo xtask image`: target/dist/latprof-VERSION.oci.tar) is one index
/// for linux/amd64 and linux/arm64, so the DaemonSet's one image name runs on mixed nodes, and
/// each platform's image holds latprof built for it (the ELF header's machine: x86-64's 0x3e,
/// AArch64's 0xb7), static (no program interpreter).
#[test]
#[ignore = "needs the image archive: run `cargo xtask test`"]
fn the_image_index_has_both_platforms_each_with_its_own_binary() {
    let archive = std::path::PathBuf::from(format!(
        "{}/../target/dist/latprof-{}.oci.tar",
        env!("CARGO_MANIFEST_DIR"),
        env!("CARGO_PKG_VERSION")
    ));
    assert!(
        archive.is_file(),
        "{} is missing: `cargo xtask image` builds it (`cargo xtask test` does)",
        archive.display()
    );
    let dir = std::env::temp_dir().join(format!("latprof-oci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let untar = |archive: &std::path::Path, into: &std::path::Path| {
        std::fs::create_dir_all(into).expect("a folder");
        let status = Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(into)
            .status()
            .expect("tar");
        assert!(status.success(), "tar -xf {}", archive.display());
    };
    untar(&archive, &dir);
    let blob = |digest: &str| -> std::path::PathBuf {
        dir.join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").expect("a sha256 digest"))
    };
    let json = |path: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).expect("read a blob")).expect("JSON")
    };
    // index.json names the index podman pushed, which names one manifest per platform.
    let top = json(&dir.join("index.json"));
    let index = json(&blob(
        top["manifests"][0]["digest"].as_str().expect("a digest"),
    ));
    let mut platforms = Vec::new();
    for (n, manifest) in index["manifests"]
        .as_array()
        .expect("the index's manifests")
        .iter()
        .enumerate()
    {
        let arch = manifest["platform"]["architecture"]
            .as_str()
            .expect("a platform")
            .to_owned();
        assert_eq!(manifest["platform"]["os"], "linux");
        let layers = json(&blob(manifest["digest"].as_str().expect("a digest")));
        let root = dir.join(format!("root{n}"));
        for layer in layers["layers"].as_array().expect("layers") {
            untar(&blob(layer["digest"].as_str().expect("a digest")), &root);
        }
        let binary = std::fs::read(root.join("usr/bin/latprof")).expect("/usr/bin/latprof");
        let machine = u16::from_le_bytes([binary[18], binary[19]]);
        let want = match arch.as_str() {
            "amd64" => 0x3e,
            "arm64" => 0xb7,
            other => panic!("a platform latprof is not built for: {other}"),
        };
        assert_eq!(
            machine, want,
            "{arch}'s image holds another machine's binary"
        );
        let said = Command::new("file")
            .arg("-b")
            .arg(root.join("usr/bin/latprof"))
            .output()
            .expect("file");
        let said = String::from_utf8_lossy(&said.stdout);
        assert!(
            said.contains("statically linked") || said.contains("static-pie linked"),
            "{arch}: {said}"
        );
        platforms.push(arch);
    }
    platforms.sort();
    assert_eq!(platforms, ["amd64", "arm64"]);
    let _ = std::fs::remove_dir_all(&dir);
}
