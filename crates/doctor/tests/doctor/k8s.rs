//! Kubernetes rules on fixtures: positions for every rule on a manifest with every trap, zero
//! findings on the clean one, Helm output attributed to its template, live checks against a
//! loopback server.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;
use upkeep_doctor::finding::{Finding, Severity};
use upkeep_doctor::k8s::{check_paths, K8sError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/k8s")
        .join(name)
}

fn check(name: &str) -> Vec<Finding> {
    check_paths(&[fixture(name)], None).unwrap_or_else(|e| panic!("{e}"))
}

fn at(f: &[Finding], rule: &str) -> Vec<(u32, u32)> {
    f.iter()
        .filter(|f| f.rule == rule)
        .map(|f| (f.location.line.unwrap(), f.location.column.unwrap()))
        .collect()
}

#[test]
fn probe_same_endpoint_fires_on_shared_health_path() {
    assert_eq!(at(&check("traps.yaml"), "probe-same-endpoint"), [(28, 21)]);
}

#[test]
fn liveness_external_deps_fires_on_aggregate_health_path() {
    assert_eq!(
        at(&check("traps.yaml"), "liveness-external-deps"),
        [(28, 21)]
    );
}

#[test]
fn initial_delay_without_startup_probe_fires_on_the_guess() {
    assert_eq!(
        at(&check("traps.yaml"), "initial-delay-without-startup-probe"),
        [(30, 34)]
    );
}

#[test]
fn probe_timeout_ge_period_fires_on_equal_timeout_and_period() {
    assert_eq!(
        at(&check("traps.yaml"), "probe-timeout-ge-period"),
        [(37, 29)]
    );
    // Defaults count: timeout 1 s against an explicit period of 1 s, in a List's Pod.
    assert_eq!(
        at(&check("pod-list.yaml"), "probe-timeout-ge-period"),
        [(14, 28)]
    );
}

#[test]
fn no_drain_fires_without_pre_stop() {
    assert_eq!(at(&check("traps.yaml"), "no-drain"), [(18, 17)]);
}

#[test]
fn no_drain_fires_when_pre_stop_outlasts_the_grace_period() {
    let f = check("helm-rendered.yaml");
    assert_eq!(at(&f, "no-drain"), [(30, 38)]);
    let d = f.iter().find(|f| f.rule == "no-drain").unwrap();
    assert!(
        d.problem
            .contains("Helm template web/templates/statefulset.yaml"),
        "{}",
        d.problem
    );
}

#[test]
fn keepalive_order_fires_when_the_app_closes_before_the_alb() {
    let f = check("traps.yaml");
    assert_eq!(at(&f, "keepalive-order"), [(25, 22)]);
    let k = f.iter().find(|f| f.rule == "keepalive-order").unwrap();
    assert_eq!(k.severity, Severity::Error);
    assert_eq!(k.details["lb_idle_s"], 300.0);
    assert_eq!(k.details["app_keepalive_s"], 5.0);
}

#[test]
fn keepalive_order_warns_on_a_thin_margin_from_server_flags() {
    // uvicorn --timeout-keep-alive 62 behind a 60 s load balancer: longer, but by 2 s.
    let f = check("helm-rendered.yaml");
    assert_eq!(at(&f, "keepalive-order"), [(34, 43)]);
    assert_eq!(
        f.iter()
            .find(|f| f.rule == "keepalive-order")
            .unwrap()
            .severity,
        Severity::Warning
    );
}

#[test]
fn clean_manifests_give_zero_findings() {
    let f = check("clean.yaml");
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn traps_manifest_gives_exactly_the_expected_rules() {
    let mut rules: Vec<&str> = check("traps.yaml").iter().map(|f| f.rule).collect();
    rules.sort_unstable();
    assert_eq!(
        rules,
        [
            "initial-delay-without-startup-probe",
            "keepalive-order",
            "liveness-external-deps",
            "no-drain",
            "probe-same-endpoint",
            "probe-timeout-ge-period"
        ]
    );
}

#[test]
fn a_directory_is_read_recursively() {
    let f = check_paths(
        &[Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k8s/dir")],
        None,
    );
    let f = f.unwrap();
    assert_eq!(
        f.iter().filter(|f| f.rule == "keepalive-order").count(),
        1,
        "{f:#?}"
    );
}

#[test]
fn broken_yaml_is_an_error_with_file_and_position() {
    let e = check_paths(&[fixture("broken.yaml")], None).unwrap_err();
    let K8sError::Yaml { file, source } = &e else {
        panic!("{e:?}")
    };
    assert!(file.ends_with("broken.yaml"));
    assert!(source.line >= 5, "{e}");
    assert!(e.to_string().contains("broken.yaml:"), "{e}");
}

/// Serves one HTTP response per connection after `delay`, for `count` connections.
fn serve(
    body: &'static str,
    delay: Duration,
    count: usize,
) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        for _ in 0..count {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            std::thread::sleep(delay);
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        }
    });
    (base, h)
}

fn live_manifest(dir: &Path, path: &str, timeout: u32) -> PathBuf {
    let p = dir.join("live.yaml");
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: p }}\nspec:\n  containers:\n    - name: c\n      livenessProbe:\n        httpGet: {{ path: {path}, port: 80 }}\n        timeoutSeconds: {timeout}\n"
        ),
    )
    .unwrap();
    p
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("upkeep-doctor-k8s-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn live_liveness_reporting_dependencies_is_flagged() {
    let dir = temp_dir("deps");
    let (base, h) = serve(
        r#"{"status":"ok","info":{"mysql":{"status":"up"},"opensearch":{"status":"up"}}}"#,
        Duration::ZERO,
        1,
    );
    let f = check_paths(&[live_manifest(&dir, "/livez", 1)], Some(&base)).unwrap();
    h.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let deps: Vec<_> = f
        .iter()
        .filter(|f| f.rule == "liveness-external-deps")
        .collect();
    assert_eq!(deps.len(), 1, "{f:#?}");
    assert_eq!(
        deps[0].details["dependencies"],
        serde_json::json!(["mysql", "opensearch"])
    );
}

#[test]
fn live_liveness_slow_against_its_timeout_is_flagged_and_fast_plain_one_is_not() {
    let dir = temp_dir("slow");
    let (base, h) = serve(r#"{"status":"ok"}"#, Duration::from_millis(1200), 1);
    let f = check_paths(&[live_manifest(&dir, "/livez", 1)], Some(&base)).unwrap();
    h.join().unwrap();
    let slow: Vec<_> = f
        .iter()
        .filter(|f| f.rule == "liveness-external-deps")
        .collect();
    assert_eq!(slow.len(), 1, "{f:#?}");
    assert_eq!(slow[0].severity, Severity::Error);
    assert!(slow[0].details["measured_s"].as_f64().unwrap() >= 1.0);

    let (base, h) = serve(r#"{"status":"ok"}"#, Duration::ZERO, 1);
    let f = check_paths(&[live_manifest(&dir, "/livez", 1)], Some(&base)).unwrap();
    h.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn live_check_against_a_closed_port_is_an_error() {
    let dir = temp_dir("closed");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = check_paths(
        &[live_manifest(&dir, "/livez", 1)],
        Some(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(matches!(e, K8sError::Live(_)), "{e:?}");
}

#[test]
fn no_drain_only_for_http_workloads_behind_a_service_without_opt_out() {
    let f = check_paths(&[fixture("workloads")], None).unwrap();
    let got: Vec<_> = f
        .iter()
        .map(|f| {
            let file = Path::new(&f.location.file)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (f.rule, file, f.location.line.unwrap())
        })
        .collect();
    // Redis and etcd StatefulSets, the Redis Deployment, the DaemonSet, the Job, the worker
    // without a Service, the annotated API and the cart with a drain give nothing.
    assert_eq!(got, [("no-drain", "web.yaml".to_owned(), 19)], "{f:#?}");
    assert!(
        f[0].problem.contains("Deployment/frontend"),
        "{}",
        f[0].problem
    );
}

/// Every Kubernetes finding the fixtures produce, covering every k8s rule and both shapes
/// of the no-drain and keepalive-order fixes.
fn all_k8s_findings() -> Vec<Finding> {
    let mut f = Vec::new();
    for name in [
        "traps.yaml",
        "helm-rendered.yaml",
        "pod-list.yaml",
        "dir",
        "workloads",
    ] {
        f.extend(check(name));
    }
    f
}

#[test]
fn every_kubernetes_fix_snippet_parses_as_yaml() {
    let f = all_k8s_findings();
    let mut rules: Vec<&str> = f.iter().map(|f| f.rule).collect();
    rules.sort_unstable();
    rules.dedup();
    assert_eq!(
        rules,
        [
            "initial-delay-without-startup-probe",
            "keepalive-order",
            "liveness-external-deps",
            "no-drain",
            "probe-same-endpoint",
            "probe-timeout-ge-period"
        ]
    );
    for x in &f {
        let docs = upkeep_doctor::k8s::yaml::parse_documents(&x.fix)
            .unwrap_or_else(|e| panic!("{} fix is not YAML ({e}):\n{}", x.rule, x.fix));
        assert_eq!(docs.len(), 1, "{}", x.fix);
        assert!(
            !docs[0].root.entries().is_empty(),
            "{} fix is not a mapping:\n{}",
            x.rule,
            x.fix
        );
    }
    // The preStop fix for clusters before 1.30 names exec's command list.
    let drain = f
        .iter()
        .find(|x| x.rule == "no-drain" && x.fix.contains("preStop"))
        .unwrap();
    assert!(
        drain.fix.contains("exec: { command: [\"sleep\", \"10\"] }"),
        "{}",
        drain.fix
    );
    let docs = upkeep_doctor::k8s::yaml::parse_documents("exec: { command: [\"sleep\", \"10\"] }")
        .unwrap();
    assert_eq!(
        docs[0]
            .root
            .path(&["exec", "command"])
            .unwrap()
            .items()
            .len(),
        2
    );
}

#[test]
fn keepalive_order_fix_keeps_the_containers_own_command() {
    let f = check("helm-rendered.yaml");
    let k = f.iter().find(|f| f.rule == "keepalive-order").unwrap();
    assert!(
        k.fix
            .starts_with("command: [\"uvicorn\", \"app:app\", \"--timeout-keep-alive\", \"72\"]"),
        "{}",
        k.fix
    );
}

#[test]
fn no_drain_tells_agent_and_datastore_images_from_look_alike_names() {
    let dir = temp_dir("lookalike");
    let p = dir.join("hotel.yaml");
    std::fs::write(
        &p,
        "apiVersion: v1\nkind: Service\nmetadata: { name: hotel }\nspec:\n  selector: { app: hotel }\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: { name: hotel }\nspec:\n  template:\n    metadata: { labels: { app: hotel } }\n    spec:\n      containers:\n        - name: hotel\n          image: registry.example/hotel-redistribution:1\n          ports: [{ containerPort: 8080 }]\n",
    )
    .unwrap();
    let f = check_paths(&[p], None).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        f.iter().map(|f| f.rule).collect::<Vec<_>>(),
        ["no-drain"],
        "{f:#?}"
    );
}
