//! The three formats: SARIF validated against the SARIF 2.1.0 JSON schema, JSON parseable
//! with stable fields, text naming rule and position; and the CLI's exit codes.

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use upkeep_doctor::cli::{exit_status, render, run, DoctorArgs, Format};
use upkeep_doctor::finding::{render_sarif, Finding, Severity, RULES};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Findings from every source, covering every location shape (line+column, line, none).
fn sample() -> Vec<Finding> {
    let fx = fixtures();
    let mut f = upkeep_doctor::nginx::check_file(
        &fx.join("nginx/resolve-duplicate-host.bad.conf"),
        None,
        None,
    )
    .unwrap();
    f.extend(upkeep_doctor::k8s::check_paths(&[fx.join("k8s/traps.yaml")], None).unwrap());
    let logs = [
        fx.join("logs/nxdomain.log"),
        fx.join("logs/max-fails.log"),
        fx.join("logs/dns-timeout.log"),
    ];
    let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    f.extend(upkeep_doctor::logs::analyze(&logs, &[fx.join("logs/access.log").as_path()]).unwrap());
    f.push(Finding::new(
        "keepalive-order",
        Severity::Info,
        upkeep_doctor::finding::Location::whole("http://127.0.0.1:8080/status"),
        "p",
        "c",
        "x",
    ));
    f
}

/// The official schema's `language` pattern, with a stray `]` that ECMA-262 engines accept
/// and Rust's regex engines refuse to compile.
const BROKEN_LANGUAGE_PATTERN: &str = "^[a-zA-Z]{2}|^[a-zA-Z]{2}-[a-zA-Z]{2}]?$";

fn drop_broken_pattern(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if m.get("pattern").and_then(|p| p.as_str()) == Some(BROKEN_LANGUAGE_PATTERN) {
                m.remove("pattern");
            }
            m.values_mut().for_each(drop_broken_pattern);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(drop_broken_pattern),
        _ => {}
    }
}

/// The SARIF 2.1.0 schema with format checks on; only the one uncompilable pattern (on
/// `language`, which the doctor never writes) is dropped.
fn validator() -> jsonschema::Validator {
    let mut schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("sarif-schema-2.1.0.json")).unwrap(),
    )
    .unwrap();
    drop_broken_pattern(&mut schema);
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .unwrap()
}

#[test]
fn sarif_output_validates_against_the_sarif_2_1_0_schema() {
    let validator = validator();
    for findings in [sample(), Vec::new()] {
        let doc: serde_json::Value = serde_json::from_str(&render_sarif(&findings)).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(
            doc["runs"][0]["results"].as_array().unwrap().len(),
            findings.len()
        );
    }
}

#[test]
fn the_schema_check_rejects_a_broken_sarif_log() {
    // Guards the test above: the validator must fail on a log that breaks the schema.
    let validator = validator();
    let mut doc: serde_json::Value = serde_json::from_str(&render_sarif(&sample())).unwrap();
    doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] =
        serde_json::json!(0);
    assert!(!validator.is_valid(&doc));
    doc["version"] = serde_json::json!("2.0.0");
    assert!(!validator.is_valid(&doc));
}

#[test]
fn sarif_results_carry_rule_level_and_region() {
    let doc: serde_json::Value = serde_json::from_str(&render_sarif(&sample())).unwrap();
    let run = &doc["runs"][0];
    let ids: Vec<&str> = run["tool"]["driver"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, RULES.iter().map(|r| r.id).collect::<Vec<_>>());
    let first = &run["results"][0];
    assert_eq!(first["ruleId"], "resolve-duplicate-host");
    assert_eq!(first["level"], "error");
    assert_eq!(
        first["locations"][0]["physicalLocation"]["region"]["startLine"],
        6
    );
    assert_eq!(
        first["locations"][0]["physicalLocation"]["region"]["startColumn"],
        9
    );
    assert_eq!(
        ids[first["ruleIndex"].as_u64().unwrap() as usize],
        "resolve-duplicate-host"
    );
}

#[test]
fn json_output_has_stable_fields() {
    let doc: serde_json::Value =
        serde_json::from_str(&render(&sample(), Format::Json, false)).unwrap();
    let f = &doc["findings"][0];
    for key in [
        "rule",
        "severity",
        "location",
        "problem",
        "consequence",
        "fix",
    ] {
        assert!(f.get(key).is_some(), "missing {key} in {f}");
    }
    assert_eq!(f["severity"], "error");
    assert_eq!(f["location"]["line"], 6);
}

#[test]
fn text_output_names_position_rule_and_fix_without_colour_off_a_tty() {
    let t = render(&sample(), Format::Text, false);
    assert!(
        t.contains("resolve-duplicate-host.bad.conf:6:9: error [resolve-duplicate-host]"),
        "{t}"
    );
    assert!(t.contains("  fix:\n    # keep one line per host"), "{t}");
    assert!(!t.contains('\x1b'));
    assert!(render(&sample(), Format::Text, true).contains("\x1b[1;31merror\x1b[0m"));
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: DoctorArgs,
}

fn exit(argv: &[&str]) -> ExitCode {
    let cli = Cli::try_parse_from(std::iter::once("doctor").chain(argv.iter().copied())).unwrap();
    run(cli.args).unwrap()
}

fn path(rel: &str) -> String {
    fixtures().join(rel).display().to_string()
}

#[test]
fn exit_code_is_1_on_findings_at_or_above_fail_on_and_0_otherwise() {
    let bad = path("nginx/resolve-single-name.bad.conf");
    assert_eq!(
        exit(&["nginx", &bad, "--format", "json"]),
        ExitCode::from(1)
    );
    assert_eq!(
        exit(&["nginx", &bad, "--fail-on", "error", "--format", "sarif"]),
        ExitCode::from(0)
    );
    assert_eq!(
        exit(&["nginx", &path("nginx/clean-per-dc.conf")]),
        ExitCode::from(0)
    );
    // Info findings pass the default gate and fail an info gate.
    let info = path("nginx/upstream-keepalive-timeout-long.bad.conf");
    assert_eq!(exit(&["nginx", &info]), ExitCode::from(0));
    assert_eq!(
        exit(&["nginx", &info, "--fail-on", "info"]),
        ExitCode::from(1)
    );
    assert_eq!(
        exit(&[
            "logs",
            &path("logs/nxdomain.log"),
            "--access-log",
            &path("logs/access.log")
        ]),
        ExitCode::from(1)
    );
    assert_eq!(exit(&["k8s", &path("k8s/clean.yaml")]), ExitCode::from(0));
}

#[test]
fn exit_code_is_2_on_unreadable_input() {
    assert_eq!(
        exit(&["nginx", &path("nginx/broken-eof.conf")]),
        ExitCode::from(2)
    );
    assert_eq!(exit(&["logs", &path("logs/none.log")]), ExitCode::from(2));
    assert_eq!(exit(&["k8s", &path("k8s/broken.yaml")]), ExitCode::from(2));
    assert_eq!(
        exit(&["keepalive", "https://127.0.0.1/"]),
        ExitCode::from(2)
    );
}

#[test]
fn exit_status_compares_severities() {
    let f = sample();
    assert_eq!(exit_status(&f, Severity::Error), 1);
    assert_eq!(exit_status(&[], Severity::Info), 0);
    let infos: Vec<Finding> = f
        .into_iter()
        .filter(|f| f.severity == Severity::Info)
        .collect();
    assert_eq!(exit_status(&infos, Severity::Warning), 0);
    assert_eq!(exit_status(&infos, Severity::Info), 1);
}

#[test]
fn durations_parse_with_units() {
    use std::time::Duration;
    use upkeep_doctor::cli::parse_duration;
    assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert!(parse_duration("soon").is_err());
}

/// The binary wires the doctor as `upkeep doctor ...`, a subcommand holding `DoctorArgs`.
#[derive(Parser)]
enum Upkeep {
    Doctor(DoctorArgs),
}

#[test]
fn doctor_args_parse_as_a_subcommand_like_the_binary_wires_them() {
    use clap::CommandFactory;
    Upkeep::command().debug_assert();
    let Upkeep::Doctor(a) = Upkeep::try_parse_from([
        "upkeep",
        "doctor",
        "keepalive",
        "http://127.0.0.1:1/",
        "--lb-idle",
        "300s",
    ])
    .unwrap();
    let upkeep_doctor::cli::DoctorCommand::Keepalive(k) = a.command else {
        panic!("wrong subcommand")
    };
    assert_eq!(k.lb_idle, std::time::Duration::from_secs(300));
    // The default wait is long enough to conclude against --lb-idle (300 s + 30 s margin).
    assert_eq!(k.max_wait, None);
    assert_eq!(k.max_wait(), std::time::Duration::from_secs(331));
    assert!(Upkeep::try_parse_from(["upkeep", "doctor", "nginx"]).is_err());
    assert!(
        Upkeep::try_parse_from(["upkeep", "doctor", "k8s", "x.yaml", "--format", "xml"]).is_err()
    );
}

#[test]
fn keepalive_defaults_can_reach_a_verdict() {
    use std::time::Duration;
    use upkeep_doctor::keepalive::{verdict, Close, Measurement};
    let Upkeep::Doctor(a) =
        Upkeep::try_parse_from(["upkeep", "doctor", "keepalive", "http://127.0.0.1:1/"]).unwrap();
    let upkeep_doctor::cli::DoctorCommand::Keepalive(k) = a.command else {
        panic!("wrong subcommand")
    };
    assert_eq!(k.lb_idle, Duration::from_secs(60));
    // A server still open when the default wait ends outlasts the default hop: a verdict,
    // not "cannot conclude".
    let m = Measurement {
        url: "http://127.0.0.1:1/".to_owned(),
        status: 200,
        hint: None,
        connection_close: false,
        close: Close::StillOpen(k.max_wait()),
    };
    let v = verdict(&m, k.lb_idle);
    assert!(v.consequence.contains("no reuse race"), "{}", v.consequence);
    assert!(
        !v.consequence.contains("Cannot conclude"),
        "{}",
        v.consequence
    );
}

#[test]
fn user_facing_texts_of_the_doctor_cite_only_project_pages() {
    use clap::CommandFactory;
    let mut help = Vec::new();
    let mut cmd = Upkeep::command();
    for sub in ["nginx", "logs", "k8s", "keepalive"] {
        let mut c = cmd
            .find_subcommand_mut("doctor")
            .unwrap()
            .find_subcommand_mut(sub)
            .unwrap()
            .clone();
        help.push(c.render_long_help().to_string());
    }
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/doctor.md"))
            .unwrap();
    let findings: Vec<String> = sample()
        .iter()
        .map(|f| format!("{} {} {}", f.problem, f.consequence, f.fix))
        .collect();
    let rules: Vec<String> = RULES.iter().map(|r| r.description.to_owned()).collect();
    for text in help
        .iter()
        .chain(&findings)
        .chain(&rules)
        .chain(std::iter::once(&docs))
    {
        let lower = text.to_lowercase();
        for word in ["seed", "write-up", "writeup"] {
            assert!(!lower.contains(word), "{word:?} in: {text}");
        }
    }
    // Every citation points at one of the sections of docs/incidents.md.
    for text in &findings {
        for (i, _) in text.match_indices("docs/incidents.md") {
            let anchor: String = text[i + "docs/incidents.md".len()..]
                .chars()
                .take_while(|c| *c == '#' || c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            assert!(
                [
                    "#nxdomain",
                    "#single-peer-guard",
                    "#keepalive-race",
                    "#probe-cascade"
                ]
                .contains(&anchor.as_str()),
                "{anchor:?} in: {text}"
            );
        }
    }
    // The --fail-on help of checks that are not configs does not speak of configs nginx rejects.
    for h in &help {
        assert!(!h.contains("nginx would reject"), "{h}");
    }
}
