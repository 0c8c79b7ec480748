//! The demo's combined picture (SVG and PNG): one panel per incident class, one lane per
//! target, and in each lane a strip per scenario with every 100 ms of the run coloured by how
//! its requests ended, injected faults marked above it.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use super::headline::{versioned, TARGETS};
use super::incidents::CLASSES;
use super::RunReport;

pub mod canvas;

use canvas::{Canvas, Nothing, Raster, Rgb, Svg};

/// Picture width, pixels.
pub const WIDTH: u32 = 1400;
const MARGIN: f64 = 16.0;
const LABEL_W: f64 = 390.0;
const TITLE_H: f64 = 74.0;
const PANEL_HEAD: f64 = 30.0;
const STRIP_H: f64 = 22.0;
const BAND_H: f64 = 5.0;
const STRIP_STEP: f64 = STRIP_H + BAND_H + 3.0;
const LANE_MIN: f64 = 50.0;
const LANE_GAP: f64 = 8.0;
const AXIS_H: f64 = 26.0;
const PANEL_GAP: f64 = 14.0;
/// Bucket width of the strips (the run's records are counted per 100 ms).
const BUCKET_S: f64 = 0.1;

/// Answered (2xx-4xx).
pub const OK: Rgb = (70, 170, 95);
/// Answered with a 5xx.
pub const SERVER_ERROR: Rgb = (215, 40, 40);
/// No response (refused, reset, closed, timeout).
pub const NO_RESPONSE: Rgb = (55, 55, 55);
/// No request fell in this 100 ms.
pub const IDLE: Rgb = (232, 232, 232);
/// An injected fault held.
pub const FAULT: Rgb = (235, 130, 30);
const TEXT: Rgb = (25, 25, 25);
const MUTED: Rgb = (110, 110, 110);
const GOOD: Rgb = (30, 120, 55);
const PANEL_BG: Rgb = (248, 248, 250);

/// Where one scenario's strip of one target landed, for checking a drawing.
#[derive(Debug, Clone, PartialEq)]
pub struct Strip {
    /// Incident class (anchor id).
    pub class: &'static str,
    /// `nginx`, `haproxy` or `upkeep`.
    pub target: String,
    /// Scenario.
    pub scenario: String,
    /// Left edge of second 0, pixels.
    pub x: f64,
    /// Top, pixels.
    pub y: f64,
    /// Width of the panel's time axis, pixels.
    pub w: f64,
    /// Height, pixels.
    pub h: f64,
    /// Seconds the panel's time axis spans.
    pub span_s: f64,
}

/// A picture that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PictureError {
    /// No TrueType font to draw the PNG's text with.
    #[error("no TrueType font for the PNG's text (tried {}); install fonts-dejavu-core or set UPKEEP_FONT", .0.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    NoFont(Vec<PathBuf>),
    /// PNG encoding.
    #[error("encoding PNG: {0}")]
    Png(String),
    /// Writing a file.
    #[error("writing {path}: {error}")]
    Write {
        /// File.
        path: String,
        /// Cause.
        error: std::io::Error,
    },
    /// No row belongs to an incident class.
    #[error("no row of an incident class to draw")]
    Empty,
}

/// Rows of the classes present, and the targets present, in drawing order.
fn classes_and_targets(
    rows: &[RunReport],
) -> (
    Vec<&'static super::incidents::IncidentClass>,
    Vec<&'static str>,
) {
    let classes = CLASSES
        .iter()
        .filter(|c| {
            rows.iter()
                .any(|r| c.scenarios.contains(&r.scenario.as_str()))
        })
        .collect();
    let targets = TARGETS
        .into_iter()
        .filter(|t| rows.iter().any(|r| r.target == *t))
        .collect();
    (classes, targets)
}

fn lane_height(strips: usize) -> f64 {
    (strips as f64 * STRIP_STEP).max(LANE_MIN)
}

/// Height of the picture of `rows`.
pub fn height(rows: &[RunReport]) -> u32 {
    let (classes, targets) = classes_and_targets(rows);
    let mut h = TITLE_H;
    for c in &classes {
        h += PANEL_HEAD + AXIS_H + PANEL_GAP;
        h += targets.len() as f64 * (lane_height(c.scenarios.len()) + LANE_GAP);
    }
    (h + MARGIN).ceil() as u32
}

/// Draws the picture of `rows` on `canvas` and says where every strip went.
pub fn draw(rows: &[RunReport], canvas: &mut impl Canvas) -> Vec<Strip> {
    let (classes, targets) = classes_and_targets(rows);
    let width = f64::from(WIDTH);
    let x0 = MARGIN + LABEL_W;
    let axis_w = width - MARGIN - x0;
    canvas.text(
        MARGIN,
        26.0,
        18.0,
        "upkeep demo: every request, per 100 ms, one panel per incident class (docs/incidents.md), one lane per target",
        TEXT,
        true,
    );
    let legend: [(Rgb, &str); 5] = [
        (OK, "answered (2xx-4xx)"),
        (SERVER_ERROR, "5xx"),
        (NO_RESPONSE, "no response (refused, reset, timeout)"),
        (IDLE, "no request in these 100 ms"),
        (FAULT, "injected fault (band above the strip)"),
    ];
    let mut lx = MARGIN;
    for (color, name) in legend {
        canvas.rect(lx, 42.0, 14.0, 14.0, color);
        canvas.text(lx + 20.0, 54.0, 13.0, name, TEXT, false);
        lx += 36.0 + name.chars().count() as f64 * 6.4;
    }
    let mut places = Vec::new();
    let mut y = TITLE_H;
    for class in classes {
        let class_rows: Vec<&RunReport> = rows
            .iter()
            .filter(|r| class.scenarios.contains(&r.scenario.as_str()))
            .collect();
        let span_s = class_rows
            .iter()
            .map(|r| r.duration_s)
            .fold(0.0, f64::max)
            .max(BUCKET_S);
        let lane_h = lane_height(class.scenarios.len());
        let panel_h = PANEL_HEAD + targets.len() as f64 * (lane_h + LANE_GAP) + AXIS_H;
        canvas.rect(
            MARGIN - 6.0,
            y,
            width - 2.0 * MARGIN + 12.0,
            panel_h,
            PANEL_BG,
        );
        let faults: Vec<String> = class_rows
            .iter()
            .find(|r| !r.skipped)
            .map(|r| r.faults.iter().map(|f| f.label.clone()).collect())
            .unwrap_or_default();
        let mut head = format!("{}  ({})", class.title, class.scenarios.join(", "));
        if faults.is_empty() {
            head.push_str("  - no injected fault: the race itself");
        } else {
            let _ = write!(head, "  - fault: {}", faults.join("; "));
        }
        canvas.text(MARGIN, y + 21.0, 15.0, &head, TEXT, true);
        let mut ly = y + PANEL_HEAD;
        for target in &targets {
            let mine: Vec<&&RunReport> =
                class_rows.iter().filter(|r| r.target == *target).collect();
            lane_label(canvas, rows, &mine, target, ly);
            for (i, scenario) in class.scenarios.iter().enumerate() {
                let sy = ly + i as f64 * STRIP_STEP + BAND_H + 1.0;
                let row = mine.iter().find(|r| r.scenario == *scenario);
                if class.scenarios.len() > 1 {
                    let short = scenario.rsplit('-').next().unwrap_or(scenario);
                    canvas.text(x0 - 44.0, sy + 15.0, 11.0, short, MUTED, false);
                }
                strip(canvas, row.map(|r| &***r), x0, sy, axis_w, span_s);
                places.push(Strip {
                    class: class.id,
                    target: (*target).to_owned(),
                    scenario: (*scenario).to_owned(),
                    x: x0,
                    y: sy,
                    w: axis_w,
                    h: STRIP_H,
                    span_s,
                });
            }
            ly += lane_h + LANE_GAP;
        }
        axis(canvas, x0, ly, axis_w, span_s);
        y += panel_h + PANEL_GAP;
    }
    places
}

/// Name, config pattern and figures of one target in one panel.
fn lane_label(
    canvas: &mut impl Canvas,
    all: &[RunReport],
    mine: &[&&RunReport],
    target: &str,
    y: f64,
) {
    canvas.text(MARGIN, y + 14.0, 13.5, &versioned(all, target), TEXT, true);
    let ran: Vec<&&&RunReport> = mine.iter().filter(|r| !r.skipped).collect();
    if ran.is_empty() {
        return;
    }
    let patterns: Vec<&str> = {
        let mut p: Vec<&str> = ran.iter().map(|r| r.pattern.as_str()).collect();
        p.dedup();
        p
    };
    canvas.text(MARGIN, y + 29.0, 11.5, &patterns.join(", "), MUTED, false);
    let errors: u64 = ran.iter().map(|r| r.errors).sum();
    let outage = ran.iter().map(|r| r.longest_outage_s).fold(0.0, f64::max);
    let mut figures = format!("{errors} errors, longest outage {outage:.2} s");
    if ran.iter().any(|r| r.probe_restarts.is_some()) {
        let restarts: u64 = ran.iter().filter_map(|r| r.probe_restarts).sum();
        let cuts: u64 = ran.iter().filter_map(|r| r.probe_traffic_cuts).sum();
        let _ = write!(figures, ", {restarts} restarts, {cuts} cuts");
    }
    if ran.iter().any(|r| r.lagged()) {
        figures.push_str(" (generator lagged)");
    }
    let color = if errors == 0 && ran.iter().all(|r| r.clean()) {
        GOOD
    } else {
        SERVER_ERROR
    };
    canvas.text(MARGIN, y + 44.0, 12.5, &figures, color, false);
}

/// One scenario's run as a strip: a stacked bar per 100 ms, faults as a band above it.
fn strip(canvas: &mut impl Canvas, row: Option<&RunReport>, x: f64, y: f64, w: f64, span_s: f64) {
    let Some(row) = row.filter(|r| !r.skipped) else {
        canvas.rect(x, y, w, STRIP_H, (244, 244, 244));
        let why = row
            .and_then(|r| r.skip_reason.clone())
            .unwrap_or_else(|| "not run".into());
        canvas.text(
            x + 8.0,
            y + 15.5,
            12.0,
            &format!("not run: {why}"),
            MUTED,
            false,
        );
        return;
    };
    let px = |t: f64| x + (t / span_s).clamp(0.0, 1.0) * w;
    canvas.rect(x, y, px(row.duration_s) - x, STRIP_H, IDLE);
    for f in &row.faults {
        let end = f.end_s.unwrap_or(row.duration_s).min(row.duration_s);
        canvas.rect(
            px(f.start_s),
            y - BAND_H - 1.0,
            (px(end) - px(f.start_s)).max(2.0),
            BAND_H,
            FAULT,
        );
    }
    for (i, &(ok, e5, none)) in row.buckets.iter().enumerate() {
        let total = ok + e5 + none;
        if total == 0 {
            continue;
        }
        let left = px(i as f64 * BUCKET_S).floor();
        let right = px((i + 1) as f64 * BUCKET_S).ceil();
        let mut top = y + STRIP_H;
        for (count, color) in [(ok, OK), (e5, SERVER_ERROR), (none, NO_RESPONSE)] {
            if count == 0 {
                continue;
            }
            // Any error keeps at least 3 px, so one failed request in 100 ms stays visible.
            let share = f64::from(count) / f64::from(total) * STRIP_H;
            let h = if color == OK { share } else { share.max(3.0) }.min(top - y);
            top -= h;
            canvas.rect(left, top, (right - left).max(1.0), h, color);
        }
    }
}

/// Second ticks under a panel's lanes.
fn axis(canvas: &mut impl Canvas, x: f64, y: f64, w: f64, span_s: f64) {
    let step = if span_s <= 16.0 { 1.0 } else { 2.0 };
    let mut t: f64 = 0.0;
    while t <= span_s + 1e-9 {
        let tx = x + t / span_s * w;
        canvas.rect(tx, y - 4.0, 1.0, 5.0, MUTED);
        let label = if t == 0.0 {
            "0 s".to_owned()
        } else {
            format!("{t:.0}")
        };
        canvas.text(tx - 3.0, y + 12.0, 11.0, &label, MUTED, false);
        t += step;
    }
}

/// Where the strips of `rows` go, without drawing.
pub fn strips(rows: &[RunReport]) -> Vec<Strip> {
    draw(rows, &mut Nothing)
}

/// The picture as SVG.
pub fn svg(rows: &[RunReport]) -> String {
    let mut c = Svg::new(WIDTH, height(rows));
    draw(rows, &mut c);
    c.finish()
}

/// The picture as PNG.
pub fn png(rows: &[RunReport]) -> Result<Vec<u8>, PictureError> {
    let font = canvas::font().map_err(PictureError::NoFont)?;
    let mut c = Raster::new(WIDTH, height(rows), font);
    draw(rows, &mut c);
    c.encode_png().map_err(|e| PictureError::Png(e.to_string()))
}

/// The files of a written picture.
#[derive(Debug)]
pub struct Written {
    /// `DIR/demo.svg`.
    pub svg: PathBuf,
    /// `DIR/demo.png`, or why it could not be drawn.
    pub png: Result<PathBuf, PictureError>,
}

/// Writes `DIR/demo.svg` and `DIR/demo.png` (the SVG even when the PNG cannot be drawn).
pub fn write(dir: &Path, rows: &[RunReport]) -> Result<Written, PictureError> {
    if classes_and_targets(rows).0.is_empty() {
        return Err(PictureError::Empty);
    }
    let put = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|error| PictureError::Write {
            path: path.display().to_string(),
            error,
        })?;
        Ok::<_, PictureError>(path)
    };
    let svg = put("demo.svg", svg(rows).as_bytes())?;
    let png = png(rows).and_then(|bytes| put("demo.png", &bytes));
    Ok(Written { svg, png })
}

#[cfg(test)]
mod tests;
