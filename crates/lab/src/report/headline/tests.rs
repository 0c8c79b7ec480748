use super::*;
use crate::report::synthetic;

fn line<'a>(text: &'a str, starts: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(starts))
        .unwrap_or_else(|| panic!("no line starting {starts:?} in\n{text}"))
}

#[test]
fn the_headline_has_one_line_per_incident_class_with_each_targets_errors_and_outage() {
    let h = headline(&synthetic::report());
    let header = line(&h, "incident");
    let (n, hp, up) = (
        header.find("nginx 1.22.1").unwrap(),
        header.find("haproxy 2.6.12").unwrap(),
        header
            .find(&format!("upkeep {}", env!("CARGO_PKG_VERSION")))
            .unwrap(),
    );
    assert!(n < hp && hp < up, "peers first, upkeep last: {header}");
    let nx = line(&h, "NXDOMAIN for 6 s");
    assert!(
        nx.contains("50 / 0.49 s (per-request resolve (set $up))"),
        "{nx}"
    );
    assert!(nx.contains("0 / 0.00 s (DNS endpoints)"), "{nx}");
    let guard = line(&h, "two lines for one host");
    assert!(
        guard.contains("1050 / 10.49 s (names resolved once at start)"),
        "{guard}"
    );
    // Two scenarios add up in one line; the lagged one is marked.
    let race = line(&h, "keep-alive race");
    assert!(race.contains("10 / 0.09 s (static servers) !"), "{race}");
    let probes = line(&h, "probe cascade");
    assert!(
        probes.contains("not run: nginx has no admin endpoints"),
        "{probes}"
    );
    assert!(
        probes.contains("0 / 0.00 s, 0 restarts, 0 cuts"),
        "{probes}"
    );
    // Columns line up: every cell of a column starts where its header does.
    assert_eq!(nx.find("0 / 0.00 s (resolvers"), Some(hp), "{h}");
    assert!(h.contains("!: the load generator lagged"), "{h}");
    assert!(h.contains("3,005 errors / 6.0 s") && h.contains("5,210 errors / 10.4 s"));
    // The drain scenario belongs to no class and stays out of the headline.
    assert!(!h.contains("drain"), "{h}");
}

#[test]
fn totals_add_up_per_target_and_count_skips_and_lagged_rows() {
    let t = totals(&synthetic::report());
    let nginx = line(&t, "nginx 1.22.1");
    let cells: Vec<&str> = nginx.split_whitespace().collect();
    // name (2 words), rows run, skipped, requests, errors
    assert_eq!(&cells[2..6], ["4", "1", "5600", "1100"], "{nginx}");
    assert!(
        nginx.contains("10.49 s (two-lines-one-host-rst)"),
        "{nginx}"
    );
    let haproxy = line(&t, "haproxy 2.6.12");
    assert!(haproxy.contains("generator lagged in 1 rows"), "{haproxy}");
    let upkeep = line(&t, "upkeep");
    assert!(upkeep.split_whitespace().nth(2) == Some("6"), "{upkeep}");
}

#[test]
fn the_legend_explains_every_column_of_the_table_and_lagged_rows_get_a_warning() {
    let rows = synthetic::report();
    let table = crate::report::table(&rows);
    let header = table.lines().next().unwrap();
    for column in header.split_whitespace() {
        assert!(
            LEGEND
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{column} "))),
            "{column} is not in the legend"
        );
    }
    let lines: Vec<&str> = table.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.starts_with("keepalive-race-post") && l.contains("haproxy"))
        .unwrap();
    assert!(
        lines[i + 1].contains("warning: the load generator ran 38.5 ms (p99) behind"),
        "{table}"
    );
    assert_eq!(table.matches("warning:").count(), 1, "{table}");
}
