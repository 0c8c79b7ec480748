//! Fuzzes the HTTP/1 framing check that sits under the downstream parser: any byte stream
//! gives the same verdict and the same bytes passed on however it is split, never a panic.
//! `crates/proxy/tests/proxy/fuzz_corpus.rs` replays `fuzz/ci-corpus/http1_framing` in `cargo test`;
//! fuzz from it with `cargo fuzz run http1_framing fuzz/ci-corpus/http1_framing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    upkeep_proxy::listener::framing_invariants(data);
});
