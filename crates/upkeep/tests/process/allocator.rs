//! The allocator's settings in the built binary, read back from jemalloc itself: with
//! `stats_print` on, jemalloc prints the options it runs with when the process exits.

use std::process::Command;

use crate::support::BIN;

/// The value of `opt.NAME` in jemalloc's report of a `upkeep --version` run with `conf` as
/// `_RJEM_MALLOC_CONF` (stats_print added).
fn option(conf: &str, name: &str) -> String {
    let conf = if conf.is_empty() {
        "stats_print:true".to_string()
    } else {
        format!("stats_print:true,{conf}")
    };
    let out = Command::new(BIN)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", conf)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report = String::from_utf8_lossy(&out.stderr);
    let key = format!("opt.{name}: ");
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in jemalloc's report:\n{report}"))
        .to_string()
}

#[test]
fn thread_caches_keep_256_blocks_of_each_small_size_and_the_environment_still_overrides() {
    // Built in (.cargo/config.toml): jemalloc's defaults are 20, 200 and 65536.
    assert_eq!(option("", "tcache_nslots_small_min"), "256");
    assert_eq!(option("", "tcache_nslots_small_max"), "256");
    assert_eq!(option("", "tcache_gc_incr_bytes"), "1048576");
    // An operator's `_RJEM_MALLOC_CONF` is read after the built-in setting.
    assert_eq!(
        option(
            "tcache_nslots_small_min:20,tcache_nslots_small_max:200",
            "tcache_nslots_small_min"
        ),
        "20"
    );
}
