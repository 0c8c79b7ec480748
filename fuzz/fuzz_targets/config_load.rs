//! Fuzzes the config loader (TOML surface, every-problem collection, validation): any input
//! gives a config or problems positioned inside the input, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "config_check.rs"]
mod config_check;

fuzz_target!(|data: &[u8]| config_check::check(data));
