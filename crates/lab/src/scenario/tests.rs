use super::*;

fn catalog_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

#[test]
fn every_catalog_scenario_parses_and_validates() {
    let mut n = 0;
    for entry in std::fs::read_dir(catalog_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                path.file_stem().unwrap().to_str().unwrap(),
                s.name,
                "file name and scenario name differ"
            );
            n += 1;
        }
    }
    assert!(n >= 12, "catalog has only {n} scenarios");
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let err = Scenario::parse("name = \"x\"\nduration = 5s\n", "bad.toml").unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("bad.toml:"), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
}

#[test]
fn unknown_references_are_reported_together() {
    let text = r#"
name = "x"
description = "x"
duration = "1s"
[[backend]]
name = "dc1"
ip = "127.0.0.11"
[upstream]
servers = ["dc9"]
[[fault]]
at = "1s"
backend = "dc7"
set = "explode"
"#;
    let msg = Scenario::parse(text, "x.toml").unwrap_err().to_string();
    assert!(msg.contains("dc9"), "{msg}");
    assert!(msg.contains("dc7"), "{msg}");
    assert!(msg.contains("explode"), "{msg}");
}

#[test]
fn a_backend_off_loopback_is_rejected() {
    let text = r#"
name = "x"
description = "x"
duration = "1s"
[[backend]]
name = "dc1"
ip = "10.0.0.1"
[upstream]
servers = ["dc1"]
"#;
    let msg = Scenario::parse(text, "x.toml").unwrap_err().to_string();
    assert!(msg.contains("not loopback"), "{msg}");
}
