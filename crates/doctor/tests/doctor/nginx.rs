//! nginx config rules on fixtures: each rule fires on its positive case, at the right
//! position, and stays quiet on its negative case; clean configs give zero findings.

use std::path::{Path, PathBuf};
use upkeep_doctor::finding::{Finding, Severity};
use upkeep_doctor::nginx::{check_file, parse::ParseErrorKind};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nginx")
        .join(name)
}

fn check(name: &str) -> Vec<Finding> {
    check_file(&fixture(name), None, None).unwrap_or_else(|e| panic!("{e}"))
}

fn positions(findings: &[Finding], rule: &str) -> Vec<(String, u32, u32)> {
    findings
        .iter()
        .filter(|f| f.rule == rule)
        .map(|f| {
            let file = Path::new(&f.location.file)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (file, f.location.line.unwrap(), f.location.column.unwrap())
        })
        .collect()
}

fn at(file: &str, line: u32, column: u32) -> Vec<(String, u32, u32)> {
    vec![(file.to_owned(), line, column)]
}

fn assert_quiet(name: &str, rule: &str) {
    let f = check(name);
    assert!(
        positions(&f, rule).is_empty(),
        "{rule} fired on {name}: {f:#?}"
    );
}

#[test]
fn debian_default_config_copy_gives_zero_findings() {
    let root = fixture("debian");
    let f = check_file(&root.join("etc/nginx/nginx.conf"), None, Some(&root)).unwrap();
    assert!(f.is_empty(), "{f:#?}");
    let f = check_file(
        &root.join("etc/nginx/sites-available/default"),
        None,
        Some(&root),
    )
    .unwrap();
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn debian_installed_config_gives_zero_findings_when_present() {
    let main = Path::new("/etc/nginx/nginx.conf");
    if !main.is_file() {
        // .ci/run installs nginx; there a missing config is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "nginx is installed by .ci/run"
        );
        eprintln!("skipped: /etc/nginx/nginx.conf is not installed on this machine");
        return;
    }
    let f = check_file(main, None, None).unwrap_or_else(|e| panic!("{e}"));
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn clean_per_dc_config_gives_zero_findings() {
    let f = check("clean-per-dc.conf");
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn resolve_duplicate_host_fires_on_second_line_without_max_fails_zero() {
    let f = check("resolve-duplicate-host.bad.conf");
    assert_eq!(
        positions(&f, "resolve-duplicate-host"),
        at("resolve-duplicate-host.bad.conf", 6, 9)
    );
    assert_eq!(
        f.iter()
            .find(|f| f.rule == "resolve-duplicate-host")
            .unwrap()
            .severity,
        Severity::Error
    );
    assert!(f[0].consequence.contains("10.4 s"));
}

#[test]
fn resolve_duplicate_host_quiet_with_max_fails_zero() {
    assert_quiet("resolve-duplicate-host.good.conf", "resolve-duplicate-host");
}

#[test]
fn resolve_single_name_fires_on_a_lone_gslb_name() {
    let f = check("resolve-single-name.bad.conf");
    assert_eq!(
        positions(&f, "resolve-single-name"),
        at("resolve-single-name.bad.conf", 5, 9)
    );
    assert!(f[0].consequence.contains("3,005"));
}

#[test]
fn resolve_single_name_quiet_with_one_name_per_dc_or_static_peer() {
    let f = check("resolve-single-name.good.conf");
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn resolver_valid_long_fires_on_valid_above_10s() {
    let f = check("resolver-valid-long.bad.conf");
    assert_eq!(
        positions(&f, "resolver-valid-long"),
        at("resolver-valid-long.bad.conf", 2, 25)
    );
    assert!(f[0].consequence.contains("31 s"));
}

#[test]
fn resolver_valid_long_quiet_at_10s() {
    assert_quiet("resolver-valid-long.good.conf", "resolver-valid-long");
}

#[test]
fn resolve_without_resolver_or_zone_is_reported() {
    let f = check("resolver-missing.bad.conf");
    let p = positions(&f, "resolver-valid-long");
    assert_eq!(p.len(), 2, "{f:#?}");
    assert!(p.iter().all(|(_, l, c)| (*l, *c) == (3, 37)));
    assert!(f.iter().any(|f| f.problem.contains("without a `zone`")));
    assert!(f.iter().any(|f| f.problem.contains("no `resolver`")));
}

#[test]
fn resolver_in_upstream_block_counts() {
    let f = check("resolver-in-upstream.good.conf");
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn zone_too_small_fires_on_32k_for_two_names() {
    let f = check("zone-too-small.bad.conf");
    assert_eq!(
        positions(&f, "zone-too-small"),
        at("zone-too-small.bad.conf", 4, 17)
    );
}

#[test]
fn zone_too_small_quiet_at_64k_for_two_names() {
    assert_quiet("zone-too-small.good.conf", "zone-too-small");
}

#[test]
fn error_page_retry_shim_fires_when_retrying_the_same_upstream() {
    let f = check("error-page-retry-shim.bad.conf");
    assert_eq!(
        positions(&f, "error-page-retry-shim"),
        at("error-page-retry-shim.bad.conf", 11, 13)
    );
}

#[test]
fn error_page_retry_shim_quiet_for_a_different_fallback_upstream() {
    assert_quiet("error-page-retry-shim.good.conf", "error-page-retry-shim");
}

#[test]
fn next_upstream_disabled_fires_for_a_multi_peer_upstream() {
    let f = check("next-upstream-disabled.bad.conf");
    assert_eq!(
        positions(&f, "next-upstream-disabled"),
        at("next-upstream-disabled.bad.conf", 8, 9)
    );
}

#[test]
fn next_upstream_disabled_quiet_for_single_peer_or_overridden() {
    let f = check("next-upstream-disabled.good.conf");
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn upstream_keepalive_incomplete_fires_without_http11_and_with_headers_reset() {
    // The location's own proxy_set_header drops the server's Connection "" (nginx inherits
    // proxy_set_header all or nothing), and there is no proxy_http_version 1.1.
    let f = check("upstream-keepalive-incomplete.bad.conf");
    assert_eq!(
        positions(&f, "upstream-keepalive-incomplete"),
        at("upstream-keepalive-incomplete.bad.conf", 12, 13)
    );
    assert!(
        f[0].problem
            .contains("`proxy_http_version 1.1` and a cleared `Connection` header"),
        "{}",
        f[0].problem
    );
}

#[test]
fn upstream_keepalive_incomplete_quiet_when_complete() {
    let f = check("upstream-keepalive-incomplete.good.conf");
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn upstream_keepalive_timeout_long_fires_on_the_60s_default() {
    let f = check("upstream-keepalive-timeout-long.bad.conf");
    assert_eq!(
        positions(&f, "upstream-keepalive-timeout-long"),
        at("upstream-keepalive-timeout-long.bad.conf", 4, 9)
    );
    assert_eq!(f[0].severity, Severity::Info);
    assert!(
        f[0].fix
            .contains("upkeep doctor keepalive http://10.0.0.1:8080/"),
        "{}",
        f[0].fix
    );
}

#[test]
fn upstream_keepalive_timeout_long_quiet_at_4s() {
    assert_quiet(
        "upstream-keepalive-timeout-long.good.conf",
        "upstream-keepalive-timeout-long",
    );
}

#[test]
fn includes_with_globs_are_followed_and_positions_name_the_included_file() {
    let f = check("include/nginx.conf");
    assert_eq!(
        positions(&f, "resolve-duplicate-host"),
        at("10-upstream.conf", 4, 5)
    );
    assert_eq!(
        positions(&f, "resolve-single-name"),
        at("10-upstream.conf", 3, 5)
    );
}

#[test]
fn broken_configs_give_errors_with_file_and_position() {
    let e = check_file(&fixture("broken-quote.conf"), None, None).unwrap_err();
    assert_eq!(
        (e.kind, e.pos.line, e.pos.column),
        (ParseErrorKind::UnterminatedQuote, 3, 16)
    );
    assert!(e.file.ends_with("broken-quote.conf"));
    let e = check_file(&fixture("broken-eof.conf"), None, None).unwrap_err();
    assert_eq!(
        (e.kind, e.pos.line, e.pos.column),
        (ParseErrorKind::UnexpectedEof, 5, 1)
    );
    let e = check_file(&fixture("missing.conf"), None, None).unwrap_err();
    assert!(matches!(e.kind, ParseErrorKind::Io(_)));
    assert!(e.to_string().contains("missing.conf"));
}

#[test]
fn parser_never_panics_on_truncated_or_mutated_configs() {
    // A bounded, deterministic stand-in for the fuzz target: every prefix of a real config,
    // and every position overwritten with each of nginx's special characters.
    use upkeep_doctor::nginx::parse::parse_str;
    let src = std::fs::read(fixture("clean-per-dc.conf")).unwrap();
    let lines = |b: &[u8]| b.iter().filter(|&&c| c == b'\n').count() as u32 + 1;
    for end in 0..=src.len() {
        if let Err(e) = parse_str(&src[..end], "t.conf") {
            assert!(e.pos.line >= 1 && e.pos.line <= lines(&src[..end]), "{e}");
        }
    }
    for i in 0..src.len() {
        for c in [b'{', b'}', b';', b'"', b'\'', b'\\', b'#', b'$', 0xff] {
            let mut m = src.clone();
            m[i] = c;
            if let Ok(tree) = parse_str(&m, "t.conf") {
                let _ = upkeep_doctor::nginx::rules::check(&tree);
            }
        }
    }
}

fn file_name(f: &Finding) -> String {
    Path::new(&f.location.file)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_resolver_file_included_three_times_gives_one_finding_naming_the_includes() {
    let f = check("swag/nginx.conf");
    let got: Vec<_> = f
        .iter()
        .map(|f| (f.rule, file_name(f), f.location.line, f.location.column))
        .collect();
    assert_eq!(
        got,
        [(
            "resolver-valid-long",
            "resolver.conf".to_owned(),
            Some(1),
            Some(21)
        )],
        "{f:#?}"
    );
    let sites = f[0].details["included_from"].as_array().unwrap();
    assert_eq!(sites.len(), 3, "{sites:?}");
    for app in ["grafana", "nextcloud", "sonarr"] {
        assert!(
            f[0].problem.contains(&format!("{app}.subdomain.conf:4")),
            "{}",
            f[0].problem
        );
    }
    // The fix keeps the user's resolver address and changes only valid=.
    assert_eq!(f[0].fix, "resolver 127.0.0.11 valid=5s;");
}

#[test]
fn a_missing_include_is_a_warning_and_the_fastcgi_upstreams_are_still_checked() {
    let f = check("fastcgi/nginx.conf");
    let got: Vec<_> = f
        .iter()
        .map(|f| (f.rule, f.location.line, f.location.column))
        .collect();
    assert_eq!(
        got,
        [
            ("include-missing", Some(17), Some(13)),
            ("resolve-single-name", Some(8), Some(9)),
            ("next-upstream-disabled", Some(22), Some(13)),
        ],
        "{f:#?}"
    );
    assert_eq!(f[0].severity, Severity::Warning);
    assert!(
        f[0].problem.contains("\"fastcgi_params\""),
        "{}",
        f[0].problem
    );
    // Retries are written for the module that uses the upstream, never proxy_* here.
    for x in &f[1..] {
        assert!(
            x.fix.contains("fastcgi_next_upstream error timeout;"),
            "{}",
            x.fix
        );
        assert!(!x.fix.contains("proxy_"), "{}", x.fix);
    }
    assert!(f[1]
        .fix
        .contains("server php.internal.example.com:9000 resolve;"));
    assert!(f[2].problem.contains("`fastcgi_next_upstream off`"));
}

#[test]
fn compose_service_names_get_a_fix_in_their_own_names_and_resolver() {
    let f = check("compose/nginx.conf");
    let got: Vec<_> = f
        .iter()
        .map(|f| (f.rule, f.location.line, f.details["host"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("resolve-single-name", Some(8), "relay"),
            ("resolve-single-name", Some(12), "web")
        ],
        "{f:#?}"
    );
    for (x, server) in f
        .iter()
        .zip(["server relay:3000 resolve;", "server web:9000 resolve;"])
    {
        assert!(
            x.fix.contains("resolver 127.0.0.11 valid=5s ipv6=off;"),
            "{}",
            x.fix
        );
        assert!(x.fix.contains(server), "{}", x.fix);
        assert!(!x.fix.contains("data centre"), "{}", x.fix);
        assert!(!x.fix.contains("10.0.0.2"), "{}", x.fix);
    }
}

#[test]
fn resolve_without_resolver_fix_has_no_made_up_address() {
    let f = check("resolver-missing.bad.conf");
    for x in &f {
        assert!(!x.fix.contains("10.0.0.2"), "{}", x.fix);
    }
}

#[test]
fn strict_load_still_reports_a_missing_include_as_an_error() {
    let e =
        upkeep_doctor::nginx::parse::load(&fixture("fastcgi/nginx.conf"), None, None).unwrap_err();
    assert_eq!(
        e.kind,
        ParseErrorKind::IncludeNotFound("fastcgi_params".to_owned())
    );
}

#[test]
fn a_missing_include_in_a_file_included_twice_is_one_warning_naming_both_includes() {
    let f = check("repeat-missing/nginx.conf");
    let got: Vec<_> = f
        .iter()
        .map(|f| (f.rule, file_name(f), f.location.line, f.location.column))
        .collect();
    assert_eq!(
        got,
        [("include-missing", "php.conf".to_owned(), Some(2), Some(5))],
        "{f:#?}"
    );
    assert_eq!(f[0].details["included_from"].as_array().unwrap().len(), 2);
    assert!(f[0].problem.contains("nginx.conf:7"), "{}", f[0].problem);
    assert!(f[0].problem.contains("nginx.conf:12"), "{}", f[0].problem);
}
