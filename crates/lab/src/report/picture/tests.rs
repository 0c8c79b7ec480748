use super::*;
use crate::report::synthetic;

/// The decoded PNG: width, height and RGB pixels.
fn decode(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn pixel(img: &(u32, u32, Vec<u8>), x: f64, y: f64) -> Rgb {
    let i = (y as usize * img.0 as usize + x as usize) * 3;
    (img.2[i], img.2[i + 1], img.2[i + 2])
}

/// The colour in the middle of the strip at second `t`.
fn at(img: &(u32, u32, Vec<u8>), s: &Strip, t: f64, from_top: f64) -> Rgb {
    pixel(img, s.x + t / s.span_s * s.w, s.y + s.h * from_top)
}

fn find<'a>(strips: &'a [Strip], scenario: &str, target: &str) -> &'a Strip {
    strips
        .iter()
        .find(|s| s.scenario == scenario && s.target == target)
        .unwrap_or_else(|| panic!("no strip for {scenario} / {target}"))
}

#[test]
fn the_picture_has_a_panel_per_incident_class_and_a_lane_per_target() {
    let rows = synthetic::report();
    let strips = strips(&rows);
    // 4 classes x 3 targets, the keep-alive class with a strip per scenario.
    assert_eq!(strips.len(), (1 + 1 + 2 + 1) * 3, "{strips:#?}");
    let classes: Vec<&str> = strips.iter().map(|s| s.class).collect();
    for id in [
        "nxdomain",
        "single-peer-guard",
        "keepalive-race",
        "probe-cascade",
    ] {
        assert_eq!(classes.iter().filter(|c| **c == id).count() % 3, 0, "{id}");
        assert!(classes.contains(&id), "{id}");
    }
    // Panels stack downwards in the order of docs/incidents.md, lanes nginx, HAProxy, upkeep.
    let first_y = |id: &str| strips.iter().find(|s| s.class == id).unwrap().y;
    assert!(first_y("nxdomain") < first_y("single-peer-guard"));
    assert!(first_y("single-peer-guard") < first_y("keepalive-race"));
    assert!(first_y("keepalive-race") < first_y("probe-cascade"));
    let nx = |t: &str| find(&strips, "dns-nxdomain-6s", t).y;
    assert!(nx("nginx") < nx("haproxy") && nx("haproxy") < nx("upkeep"));
    // Strips never overlap.
    for a in &strips {
        for b in &strips {
            if a != b {
                assert!(a.y + a.h <= b.y || b.y + b.h <= a.y, "{a:?} overlaps {b:?}");
            }
        }
    }

    let svg = svg(&rows);
    for text in [
        "NXDOMAIN for 6 s",
        "two lines for one host, 2 s RST",
        "keep-alive race (GET + POST)",
        "probe cascade",
        "nginx 1.22.1",
        "haproxy 2.6.12",
        "50 errors, longest outage 0.49 s",
        "not run: nginx has no admin endpoints",
        "per-request resolve (set $up)",
    ] {
        assert!(svg.contains(text), "the SVG lacks {text:?}");
    }
    assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
}

#[test]
fn the_png_decodes_and_shows_errors_where_the_report_has_them() {
    let rows = synthetic::report();
    let bytes = match png(&rows) {
        Ok(b) => b,
        Err(PictureError::NoFont(tried)) => {
            // .ci/run installs fonts-dejavu-core; there a missing font is a failure.
            assert!(std::env::var_os("CI").is_none(), "no font: {tried:?}");
            eprintln!("skipped: no TrueType font on this machine");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let img = decode(&bytes);
    assert_eq!(img.0, WIDTH);
    assert_eq!(img.1, height(&rows));
    let strips = strips(&rows);
    // nginx's 5xx from 1.5 s to 2.0 s in the NXDOMAIN panel, answered before and after.
    let s = find(&strips, "dns-nxdomain-6s", "nginx");
    assert_eq!(at(&img, s, 1.75, 0.5), SERVER_ERROR);
    assert_eq!(at(&img, s, 1.0, 0.5), OK);
    assert_eq!(at(&img, s, 5.0, 0.5), OK);
    // The two-lines outage covers 3.0..13.5 s for nginx, none for upkeep.
    let s = find(&strips, "two-lines-one-host-rst", "nginx");
    for t in [3.5, 8.0, 13.0] {
        assert_eq!(at(&img, s, t, 0.5), SERVER_ERROR, "nginx at {t} s");
    }
    let u = find(&strips, "two-lines-one-host-rst", "upkeep");
    for t in [3.5, 8.0, 13.0] {
        assert_eq!(at(&img, u, t, 0.5), OK, "upkeep at {t} s");
    }
    // The injected fault (3..5 s) is a band just above the strip.
    assert_eq!(pixel(&img, u.x + 4.0 / u.span_s * u.w, u.y - 3.0), FAULT);
    assert_ne!(pixel(&img, u.x + 8.0 / u.span_s * u.w, u.y - 3.0), FAULT);
    // HAProxy's lost race requests (no response) at 6.0 s in the POST strip.
    let h = find(&strips, "keepalive-race-post", "haproxy");
    assert_eq!(at(&img, h, 6.05, 0.5), NO_RESPONSE);
    // A target that did not run a scenario has a plain strip, no bars.
    let skipped = find(&strips, "probe-cascade", "nginx");
    let c = at(&img, skipped, 10.0, 0.9);
    assert!(![OK, SERVER_ERROR, NO_RESPONSE].contains(&c), "{c:?}");
    // Text was drawn: the title row holds dark pixels left of the strips.
    let dark = (0..img.0 / 2)
        .flat_map(|x| (10..30).map(move |y| (x, y)))
        .filter(|&(x, y)| pixel(&img, f64::from(x), f64::from(y)).0 < 80)
        .count();
    assert!(dark > 500, "the title has {dark} dark pixels");
}
