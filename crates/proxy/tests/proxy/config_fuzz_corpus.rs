//! Replays the config loader's fuzz corpus (`fuzz/inputs/config_load`) deterministically, with
//! every prefix and a spread of byte substitutions of each file, against the same invariants
//! as the `config_load` fuzz target: never a panic, problems positioned inside the input.

#[path = "../../../../fuzz/fuzz_targets/config_check.rs"]
mod config_check;

use std::path::Path;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/inputs/config_load");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn the_config_loader_keeps_its_invariants_on_the_fuzz_corpus() {
    let files = corpus();
    assert!(files.len() >= 8, "the corpus is checked in");
    for (name, data) in &files {
        let run = std::panic::catch_unwind(|| config_check::check(data));
        assert!(run.is_ok(), "{name}");
    }
}

#[test]
fn the_config_loader_keeps_its_invariants_on_truncated_and_mutated_corpus_files() {
    for (name, data) in corpus() {
        for end in 0..=data.len() {
            let run = std::panic::catch_unwind(|| config_check::check(&data[..end]));
            assert!(run.is_ok(), "{name} cut at {end}");
        }
        for i in (0..data.len()).step_by(3) {
            for c in [b'"', b'=', b'[', b'\n', b'0', b'{', b'-'] {
                let mut m = data.clone();
                m[i] = c;
                let run = std::panic::catch_unwind(|| config_check::check(&m));
                assert!(run.is_ok(), "{name} with {:?} at {i}", c as char);
            }
        }
    }
}
