//! Fuzzes the own HTTP/1 server's request reading (`upkeep_proxy::h1::server`): request heads
//! and chunked or length request bodies, pipelined. Never a panic; the same requests served
//! and the same end (waiting, closed, handed to hyper, refused) whole, split in two or byte by
//! byte; and no byte served that the framing check (`listener::framing`) refuses.
//! `crates/proxy/tests/proxy/fuzz_corpus.rs` replays `fuzz/ci-corpus/h1_server_request` in
//! `cargo test`; fuzz from it with
//! `cargo fuzz run h1_server_request fuzz/ci-corpus/h1_server_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    upkeep_proxy::h1::server_request_invariants(data);
});
