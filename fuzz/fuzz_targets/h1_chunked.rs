//! Fuzzes the upstream response body decoder (`upkeep_proxy::h1::body`): the first byte picks
//! the framing (chunked, length, close, empty); never a panic, and the same verdict, data and
//! leftover whether the input comes whole or byte by byte.
//! `crates/proxy/tests/proxy/fuzz_corpus.rs` replays `fuzz/ci-corpus/h1_chunked` in `cargo test`;
//! fuzz from it with `cargo fuzz run h1_chunked fuzz/ci-corpus/h1_chunked`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    upkeep_proxy::h1::body::decoder_invariants(data);
});
