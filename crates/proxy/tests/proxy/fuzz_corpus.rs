//! Replays the checked-in corpora of the fuzz targets (`fuzz/`), so plain
//! `cargo test` checks the same invariants on every input the fuzzer kept, without nightly.

use std::path::Path;

#[test]
fn http1_framing_corpus_keeps_the_framing_invariants() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/ci-corpus/http1_framing");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 20, "corpus has {} files", files.len());
    for f in &files {
        let data = std::fs::read(f).unwrap();
        // A failed invariant panics; name the input that broke it.
        let r = std::panic::catch_unwind(|| upkeep_proxy::listener::framing_invariants(&data));
        assert!(r.is_ok(), "{} breaks a framing invariant", f.display());
    }
}

/// Every file of `fuzz/ci-corpus/<target>`, sorted.
fn corpus(target: &str) -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/ci-corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn h1_response_head_corpus_keeps_the_parser_invariants() {
    let files = corpus("h1_response_head");
    assert!(files.len() >= 25, "corpus has {} files", files.len());
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| upkeep_proxy::h1::head::parse_invariants(&data));
        assert!(r.is_ok(), "{} breaks a parser invariant", f.display());
    }
}

#[test]
fn h1_chunked_corpus_keeps_the_decoder_invariants() {
    let files = corpus("h1_chunked");
    assert!(files.len() >= 15, "corpus has {} files", files.len());
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| upkeep_proxy::h1::body::decoder_invariants(&data));
        assert!(r.is_ok(), "{} breaks a decoder invariant", f.display());
    }
}

#[test]
fn h1_server_request_corpus_keeps_the_server_invariants() {
    let files = corpus("h1_server_request");
    assert!(files.len() >= 100, "corpus has {} files", files.len());
    let mut broken = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| upkeep_proxy::h1::server_request_invariants(&data));
        if r.is_err() {
            broken.push(f.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(broken.is_empty(), "break a server invariant: {broken:?}");
}

/// `(name, version)` of every package a `Cargo.lock` pins.
fn pinned(lock: &str) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_owned());
        } else if let Some(v) = line.strip_prefix("version = ") {
            if let Some(n) = name.take() {
                out.insert((n, v.trim_matches('"').to_owned()));
            }
        } else if line.starts_with("[[package]]") {
            name = None;
        }
    }
    out
}

/// The fuzz targets are their own workspace (cargo-fuzz builds them with nightly flags), with
/// their own `fuzz/Cargo.lock`: it must pin every crate the two share at the version the
/// shipped binary is built with, or the fuzzer tests other code than users run.
#[test]
fn fuzz_lockfile_pins_the_workspace_versions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read =
        |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let workspace = pinned(&read("Cargo.lock"));
    let fuzz = pinned(&read("fuzz/Cargo.lock"));
    assert!(
        workspace.iter().any(|(n, _)| n == "rustls") && fuzz.iter().any(|(n, _)| n == "rustls"),
        "both lockfiles pin rustls"
    );
    let names: std::collections::BTreeSet<&str> =
        workspace.iter().map(|(n, _)| n.as_str()).collect();
    let apart: Vec<_> = fuzz
        .iter()
        .filter(|(n, _)| names.contains(n.as_str()) && !n.starts_with("upkeep"))
        .filter(|p| !workspace.contains(*p))
        .collect();
    assert!(
        apart.is_empty(),
        "fuzz/Cargo.lock pins versions the workspace does not (copy Cargo.lock to fuzz/ and \
         let cargo add the fuzz crates): {apart:?}"
    );
}
