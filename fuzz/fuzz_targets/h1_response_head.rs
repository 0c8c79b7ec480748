//! Fuzzes the upstream response head parser (`upkeep_proxy::h1::head`): never a panic, and
//! every prefix of an input is still partial or gets the verdict of the whole.
//! `crates/proxy/tests/proxy/fuzz_corpus.rs` replays `fuzz/ci-corpus/h1_response_head` in
//! `cargo test`; fuzz from it with `cargo fuzz run h1_response_head fuzz/ci-corpus/h1_response_head`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    upkeep_proxy::h1::head::parse_invariants(data);
});
