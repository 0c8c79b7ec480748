//! The product speaks for itself: no text a user reads (the help of every subcommand, as the
//! real binary prints it; every finding the doctor writes on its fixtures, with its rule
//! catalogue; docs/*.md; README.md; scenarios/*.toml; examples/) refers to where its facts
//! came from instead of to docs/incidents.md. The words looked for are "seed" and "write-up"
//! (any case, "writeup" too), in any sense.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn upkeep(args: &[&str]) -> String {
    let out = Command::new(crate::support::BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("upkeep {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Lines of `text` (named `origin`) that use one of the words.
fn hits(origin: &str, text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.to_lowercase();
            l.contains("seed") || l.contains("write-up") || l.contains("writeup")
        })
        .map(|(i, l)| format!("{origin}:{}: {}", i + 1, l.trim()))
        .collect()
}

/// Subcommand names listed under `Commands:` in a clap help text.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// The help of `upkeep` and of every subcommand under it, as `(command, text)`.
fn every_help() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let help = upkeep(&args);
        for sub in subcommands(&help) {
            let mut next = path.clone();
            next.push(sub);
            todo.push(next);
        }
        out.push((format!("upkeep {} --help", path.join(" ")), help));
    }
    out
}

fn files_under(dir: &Path, keep: &dyn Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if keep(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn ext_is(p: &Path, exts: &[&str]) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| exts.contains(&e))
}

/// What the doctor prints (SARIF: findings and the whole rule catalogue) on each of its
/// fixtures, with the fixtures' own file names blanked out: they are inputs, not its words.
fn every_finding_text() -> Vec<(String, String)> {
    let fx = root().join("crates/doctor/tests/fixtures");
    let mut runs: Vec<(String, Vec<String>)> = Vec::new();
    for f in files_under(&fx.join("nginx"), &|p| ext_is(p, &["conf"])) {
        runs.push(("nginx".into(), vec![f.display().to_string()]));
    }
    let logs = files_under(&fx.join("logs"), &|p| {
        ext_is(p, &["log"]) && !p.ends_with("access.log")
    });
    runs.push((
        "logs".into(),
        logs.iter().map(|p| p.display().to_string()).collect(),
    ));
    // One file a run: a directory with an unreadable file in it stops at that file.
    for f in files_under(&fx.join("k8s"), &|p| ext_is(p, &["yaml", "yml"])) {
        runs.push(("k8s".into(), vec![f.display().to_string()]));
    }
    let mut out = Vec::new();
    for (kind, files) in runs {
        for format in ["text", "sarif"] {
            let mut args = vec!["doctor", kind.as_str()];
            args.extend(files.iter().map(String::as_str));
            args.extend(["--format", format, "--fail-on", "error"]);
            let mut text = upkeep(&args);
            for f in &files {
                let f = Path::new(f);
                for name in [f.display().to_string()]
                    .into_iter()
                    .chain(f.file_name().map(|n| n.to_string_lossy().into_owned()))
                {
                    text = text.replace(&name, "FILE");
                }
            }
            // Files an include pulled in are named in the output only.
            for p in files_under(&fx, &|p| p.extension().is_some()) {
                if let Some(n) = p.file_name() {
                    text = text.replace(&*n.to_string_lossy(), "FILE");
                }
            }
            out.push((format!("upkeep doctor {kind} ... --format {format}"), text));
        }
    }
    out
}

#[test]
fn no_user_facing_text_mentions_seeds_or_write_ups() {
    let mut found = Vec::new();
    let helps = every_help();
    assert!(
        helps.len() >= 10,
        "only {} help texts: {:?}",
        helps.len(),
        helps.iter().map(|h| &h.0).collect::<Vec<_>>()
    );
    for (origin, text) in helps {
        found.extend(hits(&origin, &text));
    }
    let findings = every_finding_text();
    assert!(
        findings
            .iter()
            .any(|(_, t)| t.contains("resolve-duplicate-host") && t.contains("\"rules\"")),
        "the doctor's SARIF carried no rule catalogue"
    );
    for (origin, text) in findings {
        found.extend(hits(&origin, &text));
    }
    let r = root();
    let mut files = files_under(&r.join("docs"), &|p| ext_is(p, &["md"]));
    files.push(r.join("README.md"));
    files.extend(files_under(&r.join("scenarios"), &|p| ext_is(p, &["toml"])));
    files.extend(files_under(&r.join("examples"), &|_| true));
    assert!(files.len() >= 20, "only {} files", files.len());
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let name = f.strip_prefix(&r).unwrap_or(&f).display().to_string();
        found.extend(hits(&name, &text));
    }
    assert!(
        found.is_empty(),
        "{} hits:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_words_are_found_where_they_occur() {
    assert_eq!(hits("x", "a\nSeeded by b\n").len(), 1);
    assert_eq!(hits("x", "the Write-Up said\nwriteup").len(), 2);
    assert!(hits("x", "nothing here").is_empty());
    let help =
        "Usage: upkeep <COMMAND>\n\nCommands:\n  serve  Run\n  help   Print\n\nOptions:\n  -h\n";
    assert_eq!(subcommands(help), ["serve"]);
}

#[test]
fn every_scenario_file_the_docs_name_exists() {
    let r = root();
    let mut files = files_under(&r.join("docs"), &|p| ext_is(p, &["md"]));
    files.push(r.join("README.md"));
    let mut named = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("scenarios/") {
            let rest = &text[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "/-_.".contains(c)))
                .unwrap_or(rest.len());
            let path = rest[..end].trim_end_matches('.');
            if !path.ends_with(".toml") || path.contains("NAME") {
                continue;
            }
            named += 1;
            assert!(
                r.join(path).is_file(),
                "{} names {path}, which does not exist",
                f.display()
            );
        }
    }
    assert!(named >= 5, "only {named} scenario paths in the docs");
}

#[test]
fn a_missing_scenario_file_prints_its_os_error_once() {
    let out = upkeep(&["lab", "run", "scenarios/no-such-scenario.toml"]);
    assert!(out.contains("scenarios/no-such-scenario.toml"), "{out}");
    assert_eq!(out.matches("os error 2").count(), 1, "{out}");
}
