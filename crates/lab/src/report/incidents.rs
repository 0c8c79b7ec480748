//! The incident classes of docs/incidents.md and the catalog scenarios that reproduce each,
//! which the demo's headline and combined picture are organised by.

/// One incident class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncidentClass {
    /// Anchor in docs/incidents.md (`nxdomain`).
    pub id: &'static str,
    /// A few words for a table row or a panel title.
    pub title: &'static str,
    /// Scenarios that reproduce it; their rows add up in the headline.
    pub scenarios: &'static [&'static str],
}

/// Every class, in the order docs/incidents.md tells them.
pub const CLASSES: &[IncidentClass] = &[
    IncidentClass {
        id: "nxdomain",
        title: "NXDOMAIN for 6 s",
        scenarios: &["dns-nxdomain-6s"],
    },
    IncidentClass {
        id: "single-peer-guard",
        title: "two lines for one host, 2 s RST",
        scenarios: &["two-lines-one-host-rst"],
    },
    IncidentClass {
        id: "keepalive-race",
        title: "keep-alive race (GET + POST)",
        scenarios: &["keepalive-race-get", "keepalive-race-post"],
    },
    IncidentClass {
        id: "probe-cascade",
        title: "probe cascade, optional dep down",
        scenarios: &["probe-cascade"],
    },
];

/// The class a scenario belongs to, if any.
pub fn class_of(scenario: &str) -> Option<&'static IncidentClass> {
    CLASSES.iter().find(|c| c.scenarios.contains(&scenario))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_names_catalog_scenarios_and_a_documented_anchor() {
        let doc = include_str!("../../../../docs/incidents.md");
        for c in CLASSES {
            assert!(
                doc.contains(&format!("<a id=\"{}\"></a>", c.id)),
                "docs/incidents.md has no anchor {}",
                c.id
            );
            for s in c.scenarios {
                let file = format!("{s}.toml");
                assert!(
                    crate::catalog::CATALOG.iter().any(|(f, _)| *f == file),
                    "{s} is not in the catalog"
                );
                assert!(
                    doc.contains(&format!("scenarios/{s}.toml")) || doc.contains(&format!("`{s}`")),
                    "docs/incidents.md does not name {s}"
                );
            }
        }
        assert_eq!(
            class_of("keepalive-race-post").unwrap().id,
            "keepalive-race"
        );
        assert!(class_of("drain").is_none());
    }
}
