//! The allocator's settings in the built binary, read back from jemalloc itself: with
//! `stats_print` on, jemalloc prints the options it runs with when the process exits.

use std::process::Command;

use crate::support::BIN;

/// jemalloc's report of a `upkeep --version` run with `_RJEM_MALLOC_CONF` set to
/// `stats_print:true` and the options in `conf`.
fn report(conf: &[&str]) -> String {
    let conf = std::iter::once("stats_print:true")
        .chain(conf.iter().copied())
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new(BIN)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", conf)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The value of `opt.NAME` in `report`.
fn option<'a>(report: &'a str, name: &str) -> &'a str {
    let key = format!("opt.{name}: ");
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in jemalloc's report:\n{report}"))
}

#[test]
fn thread_caches_keep_256_blocks_of_each_small_size_and_the_environment_still_overrides() {
    // Built in (.cargo/config.toml): jemalloc's defaults are 20, 200 and 65536.
    let built_in = report(&[]);
    assert_eq!(option(&built_in, "tcache_nslots_small_min"), "256");
    assert_eq!(option(&built_in, "tcache_nslots_small_max"), "256");
    assert_eq!(option(&built_in, "tcache_gc_incr_bytes"), "1048576");
    // An operator's `_RJEM_MALLOC_CONF` is read after the built-in setting.
    let overridden = report(&["tcache_nslots_small_min:20", "tcache_nslots_small_max:200"]);
    assert_eq!(option(&overridden, "tcache_nslots_small_min"), "20");
}
