//! The Kubernetes manifests in deploy/kubernetes/: the kustomize base and every overlay
//! render offline with `kubectl kustomize`, `upkeep doctor k8s` finds nothing in them, the
//! config their ConfigMap carries passes `upkeep check`, and its timings fit the pod spec.

use std::path::{Path, PathBuf};
use std::process::Command;

use upkeep_doctor::k8s::yaml::{parse_documents, Node};

use crate::support::{self, BIN};

const KUSTOMIZATIONS: &[&str] = &[
    "base",
    "overlays/single-namespace",
    "overlays/network-policy",
];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

fn temp_dir(name: &str) -> PathBuf {
    support::temp_dir("k8s", name)
}

/// `kubectl kustomize DIR`, or None (skip) when kubectl is missing outside CI.
fn kustomize(dir: &Path) -> Option<String> {
    match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(out) => {
            assert!(
                out.status.success(),
                "kubectl kustomize {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8(out.stdout).unwrap())
        }
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "kubectl is missing ({e}); CI installs Debian's kubernetes-client"
            );
            eprintln!("skipped: kubectl is not installed");
            None
        }
    }
}

fn objects(docs: &[upkeep_doctor::k8s::yaml::Document]) -> Vec<&Node> {
    docs.iter().map(|d| &d.root).collect()
}

fn kind<'a>(objs: &[&'a Node], kind: &str) -> Vec<&'a Node> {
    objs.iter()
        .copied()
        .filter(|o| o.get("kind").and_then(Node::as_str) == Some(kind))
        .collect()
}

fn num(n: &Node, path: &[&str]) -> f64 {
    n.path(path)
        .and_then(Node::as_f64)
        .unwrap_or_else(|| panic!("{path:?} missing"))
}

/// Seconds from `upkeep check --print`'s duration text ("10s", "250ms").
fn secs(v: &serde_json::Value) -> f64 {
    let s = v.as_str().unwrap();
    if let Some(ms) = s.strip_suffix("ms") {
        ms.parse::<f64>().unwrap() / 1000.0
    } else {
        s.strip_suffix('s').unwrap().parse().unwrap()
    }
}

#[test]
fn every_kustomization_renders_and_upkeep_doctor_k8s_finds_nothing() {
    let dir = temp_dir("doctor");
    for k in KUSTOMIZATIONS {
        let Some(rendered) = kustomize(&deploy_dir().join(k)) else {
            return;
        };
        let file = dir.join(format!("{}.yaml", k.replace('/', "-")));
        std::fs::write(&file, &rendered).unwrap();
        let out = Command::new(BIN)
            .args(["doctor", "k8s", "--format", "json", "--fail-on", "info"])
            .arg(&file)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{k}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let findings: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let list = findings
            .get("findings")
            .unwrap_or(&findings)
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {stdout}"));
        assert!(list.is_empty(), "{k}: {stdout}");

        let docs = parse_documents(&rendered).unwrap();
        let objs = objects(&docs);
        for wanted in [
            "Deployment",
            "Service",
            "ConfigMap",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "PodDisruptionBudget",
            "HorizontalPodAutoscaler",
        ] {
            assert_eq!(kind(&objs, wanted).len(), 1, "{k}: one {wanted}");
        }
        let policies = kind(&objs, "NetworkPolicy").len();
        assert_eq!(policies, usize::from(k.ends_with("network-policy")), "{k}");
        // One namespace, created by the manifests, holds everything, and the RoleBinding
        // grants to the ServiceAccount there.
        let ns = kind(&objs, "Namespace");
        assert_eq!(ns.len(), 1, "{k}");
        let ns = ns[0]
            .path(&["metadata", "name"])
            .and_then(Node::as_str)
            .unwrap();
        assert_eq!(ns, if *k == "base" { "upkeep" } else { "apps" }, "{k}");
        for o in &objs {
            if o.get("kind").and_then(Node::as_str) != Some("Namespace") {
                assert_eq!(
                    o.path(&["metadata", "namespace"]).and_then(Node::as_str),
                    Some(ns),
                    "{k}: every object in namespace {ns}"
                );
            }
        }
        let binding = kind(&objs, "RoleBinding")[0];
        let subject = &binding.get("subjects").unwrap().items()[0];
        assert_eq!(
            subject.get("namespace").and_then(Node::as_str),
            Some(ns),
            "{k}"
        );
    }
}

#[test]
fn the_configmap_config_passes_upkeep_check_and_fits_the_pod_spec() {
    let dir = temp_dir("check");
    for k in KUSTOMIZATIONS {
        let Some(rendered) = kustomize(&deploy_dir().join(k)) else {
            return;
        };
        let docs = parse_documents(&rendered).unwrap();
        let objs = objects(&docs);
        let cm = kind(&objs, "ConfigMap")[0];
        let toml = cm
            .path(&["data", "upkeep.toml"])
            .and_then(Node::as_str)
            .expect("the ConfigMap carries upkeep.toml");
        let file = dir.join(format!("{}.toml", k.replace('/', "-")));
        std::fs::write(&file, toml).unwrap();
        let out = Command::new(BIN)
            .args(["check", "--print"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{k}: upkeep check: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // `check --print` writes the effective config back as TOML, every default filled in.
        let cfg: serde_json::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();

        let deploy = kind(&objs, "Deployment")[0];
        let spec = deploy.path(&["spec", "template", "spec"]).unwrap();
        let c = &spec.get("containers").unwrap().items()[0];
        // The config the pod mounts is the one checked here.
        let cm_name = cm
            .path(&["metadata", "name"])
            .and_then(Node::as_str)
            .unwrap();
        let volume = spec.get("volumes").unwrap().items()[0]
            .path(&["configMap", "name"])
            .and_then(Node::as_str);
        assert_eq!(volume, Some(cm_name), "{k}");
        let mount = c.get("volumeMounts").unwrap().items()[0]
            .get("mountPath")
            .and_then(Node::as_str)
            .unwrap();
        let args: Vec<&str> = c
            .get("args")
            .unwrap()
            .items()
            .iter()
            .filter_map(Node::as_str)
            .collect();
        assert!(
            args.contains(&format!("{mount}/upkeep.toml").as_str()),
            "{k}: {args:?}"
        );
        // A pod with no CPU limit shares its node: its serving threads are not held to CPUs
        // (`--cpu-affinity auto` would hold one to each of the node's CPUs).
        let limits = c.path(&["resources", "limits"]);
        if limits.and_then(|l| l.get("cpu")).is_none() {
            let at = args.iter().position(|a| *a == "--cpu-affinity");
            assert_eq!(
                at.and_then(|i| args.get(i + 1)).copied(),
                Some("off"),
                "{k}: {args:?}"
            );
        }

        // Probes: three endpoints, on the probe port, which is the config's [admin] probes.
        let port_of = |name: &str| {
            c.get("ports")
                .unwrap()
                .items()
                .iter()
                .find(|p| p.get("name").and_then(Node::as_str) == Some(name))
                .map(|p| num(p, &["containerPort"]) as u16)
                .unwrap_or_else(|| panic!("port {name}"))
        };
        let probe_addr: std::net::SocketAddr =
            cfg["admin"]["probes"].as_str().unwrap().parse().unwrap();
        assert!(
            probe_addr.ip().is_unspecified(),
            "kubelet reaches the pod IP"
        );
        assert_eq!(probe_addr.port(), port_of("probes"), "{k}");
        let control: std::net::SocketAddr =
            cfg["admin"]["listen"].as_str().unwrap().parse().unwrap();
        assert!(control.ip().is_loopback(), "{k}: control stays on loopback");
        let listen: std::net::SocketAddr = cfg["listener"][0]["listen"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(listen.port(), port_of("http"), "{k}");
        for (probe, path) in [
            ("startupProbe", "/startupz"),
            ("livenessProbe", "/livez"),
            ("readinessProbe", "/readyz"),
        ] {
            let p = c.get(probe).unwrap_or_else(|| panic!("{k}: {probe}"));
            assert_eq!(
                p.path(&["httpGet", "path"]).and_then(Node::as_str),
                Some(path)
            );
            assert_eq!(
                p.path(&["httpGet", "port"]).and_then(Node::as_str),
                Some("probes")
            );
            assert!(
                num(p, &["timeoutSeconds"]) < num(p, &["periodSeconds"]),
                "{k}: {probe}"
            );
        }
        // Liveness never restarts a pod for less than 30 s of a process that does not answer.
        let l = c.get("livenessProbe").unwrap();
        assert!(num(l, &["periodSeconds"]) * num(l, &["failureThreshold"]) >= 30.0);

        // Drain: preStop, then drain_delay, then in-flight requests up to shutdown_timeout,
        // all inside the grace period.
        let pre_stop = num(c, &["lifecycle", "preStop", "sleep", "seconds"]);
        let grace = num(spec, &["terminationGracePeriodSeconds"]);
        let drain = secs(&cfg["lifecycle"]["drain_delay"]);
        let shutdown = secs(&cfg["lifecycle"]["shutdown_timeout"]);
        assert!(
            drain > 0.0,
            "{k}: readiness must fail before accepting stops"
        );
        assert!(
            pre_stop + drain + shutdown < grace,
            "{k}: {pre_stop} + {drain} + {shutdown} must be under {grace}"
        );
        // Idle keep-alive above the common cloud load balancers' (GCP 600 s, NLB 350 s, ALB 60 s).
        for l in cfg["listener"].as_array().unwrap() {
            assert!(secs(&l["idle_timeout"]) > 600.0, "{k}: {l}");
        }
        // Rolling updates never lower capacity.
        assert_eq!(
            deploy
                .path(&["spec", "strategy", "rollingUpdate", "maxUnavailable"])
                .and_then(Node::as_f64),
            Some(0.0)
        );
    }
}

/// One GET with Connection: close over a plain socket; the body, once the status is 200.
fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200")
        .then(|| out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()))
        .flatten()
}

#[test]
fn upkeep_lab_kube_serves_endpointslices_and_takes_faults_over_its_control_address() {
    let [api, control] = support::loopbacks();
    let child = Command::new(BIN)
        .args([
            "lab",
            "kube",
            "--listen",
            &api.to_string(),
            "--control",
            &control.to_string(),
        ])
        .args(["--service", "apps/web=127.0.0.11:8080,127.0.0.12:8080"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Kill(child);
    let slices = "/apis/discovery.k8s.io/v1/namespaces/apps/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb";
    let start = std::time::Instant::now();
    let body = loop {
        if let Some(b) = http_get(api, slices) {
            break b;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "lab kube did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let eps = list["items"][0]["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 2);
    assert_eq!(eps[0]["addresses"][0], "127.0.0.11");
    assert_eq!(eps[0]["conditions"]["ready"], true);
    http_get(control, "/terminate?service=apps/web&addrs=127.0.0.11:8080").unwrap();
    let list: serde_json::Value = serde_json::from_str(&http_get(api, slices).unwrap()).unwrap();
    let c = &list["items"][0]["endpoints"][0]["conditions"];
    assert_eq!(
        (
            c["ready"].as_bool(),
            c["serving"].as_bool(),
            c["terminating"].as_bool()
        ),
        (Some(false), Some(true), Some(true))
    );
    http_get(control, "/fault?set=5xx").unwrap();
    assert!(http_get(api, slices).is_none(), "5xx while the fault is on");
    http_get(control, "/fault?set=none").unwrap();
    assert!(http_get(api, slices).is_some());
}
