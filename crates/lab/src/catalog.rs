//! The scenario catalog, built into the binary so that `upkeep demo` runs anywhere.

/// `(file name, text)` of every scenario in `scenarios/`.
pub const CATALOG: &[(&str, &str)] = &[
    entry!("dns-alternate"),
    entry!("dns-nxdomain-6s"),
    entry!("dns-nodata-6s"),
    entry!("dns-servfail-10s"),
    entry!("dns-silent-10s"),
    entry!("two-lines-one-host-rst"),
    entry!("one-host-rst"),
    entry!("two-dc-one-refusing-5s"),
    entry!("one-dc-blackholed"),
    entry!("keepalive-race-get"),
    entry!("keepalive-race-post"),
    entry!("probe-cascade"),
    entry!("drain"),
    entry!("upgrade"),
    entry!("reload-under-dns-failure"),
    entry!("k8s-api-down-30s"),
    entry!("k8s-rolling-update"),
    entry!("k8s-watch-gone"),
];

macro_rules! entry {
    ($name:literal) => {
        (
            concat!($name, ".toml"),
            include_str!(concat!("../../../scenarios/", $name, ".toml")),
        )
    };
}
use entry;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    #[test]
    fn the_built_in_catalog_matches_the_scenarios_folder() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let on_disk = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "toml"))
            })
            .count();
        assert_eq!(
            on_disk,
            CATALOG.len(),
            "a scenario file is missing from CATALOG"
        );
        for (file, text) in CATALOG {
            Scenario::parse(text, file).unwrap();
        }
    }
}
