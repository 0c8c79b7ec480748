//! Replays the checked-in corpus of the `http1_framing` fuzz target (`fuzz/`), so plain
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
