//! Fuzzes the nginx config parser and the rules behind it: any input gives a tree or an
//! error with a position inside the input, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use upkeep_doctor::nginx::{parse::parse_str, rules::check};

fuzz_target!(|data: &[u8]| {
    match parse_str(data, "fuzz.conf") {
        Ok(tree) => {
            let _ = check(&tree);
        }
        Err(e) => {
            let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
            assert!(e.pos.line >= 1 && e.pos.line as usize <= lines, "{e}");
            assert!(e.pos.column >= 1, "{e}");
        }
    }
});
