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
