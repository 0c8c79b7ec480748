//! The timeline of one run as SVG: responses per 100 ms bucket (ok, 5xx, no response),
//! faults shaded, DNS queries marked along the top.

use std::path::Path;

use plotters::prelude::*;

use crate::load::RequestRecord;
use crate::timeline::FaultEvent;

/// Picks one count out of a bucket.
type Pick = fn(&(u32, u32, u32)) -> u32;

/// Bucket width of the timeline.
const BUCKET_S: f64 = 0.1;

/// A timeline that could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("timeline {path}: {message}")]
pub struct SvgError {
    /// File.
    pub path: String,
    /// Cause.
    pub message: String,
}

/// Counts per bucket: (ok, 5xx, no response).
pub fn buckets(records: &[RequestRecord], duration_s: f64) -> Vec<(u32, u32, u32)> {
    let n = ((duration_s / BUCKET_S).ceil() as usize).max(1);
    let mut out = vec![(0u32, 0u32, 0u32); n];
    for r in records {
        let i = ((r.scheduled.as_secs_f64() / BUCKET_S) as usize).min(n - 1);
        match (r.status, r.error) {
            (Some(s), _) if s >= 500 => out[i].1 += 1,
            (Some(_), _) => out[i].0 += 1,
            _ => out[i].2 += 1,
        }
    }
    out
}

/// Writes the timeline of a run to `path`.
pub fn write(
    path: &Path,
    title: &str,
    records: &[RequestRecord],
    faults: &[FaultEvent],
    dns_queries_s: &[f64],
    duration_s: f64,
) -> Result<(), SvgError> {
    let err = |e: String| SvgError {
        path: path.display().to_string(),
        message: e,
    };
    let b = buckets(records, duration_s);
    let ymax = b
        .iter()
        .map(|(a, c, d)| a + c + d)
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.15;
    let root = SVGBackend::new(path, (1000, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..duration_s.max(BUCKET_S), 0f64..ymax)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("requests / 100 ms")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let shade = RGBColor(255, 200, 200).mix(0.5);
    chart
        .draw_series(faults.iter().map(|f| {
            let end = f.end_s.unwrap_or(duration_s).min(duration_s);
            Rectangle::new([(f.start_s, 0.0), (end, ymax)], shade.filled())
        }))
        .map_err(|e| err(e.to_string()))?;
    // Each shaded span says which fault it is, at mid-height where the count lines rarely
    // are, stacked so overlapping faults stay readable.
    chart
        .draw_series(faults.iter().enumerate().map(|(i, f)| {
            Text::new(
                f.label.clone(),
                (
                    f.start_s + duration_s * 0.006,
                    ymax * (0.55 - 0.06 * (i % 4) as f64),
                ),
                ("sans-serif", 12).into_font().color(&RGBColor(150, 30, 30)),
            )
        }))
        .map_err(|e| err(e.to_string()))?;
    let series = |pick: Pick| -> Vec<(f64, f64)> {
        b.iter()
            .enumerate()
            .map(|(i, v)| (i as f64 * BUCKET_S, pick(v) as f64))
            .collect()
    };
    let lines: [(&str, RGBColor, Pick); 3] = [
        ("2xx-4xx", RGBColor(40, 150, 60), |v| v.0),
        ("5xx", RGBColor(210, 40, 40), |v| v.1),
        ("no response", RGBColor(40, 40, 40), |v| v.2),
    ];
    for (name, color, pick) in lines {
        chart
            .draw_series(LineSeries::new(series(pick), color.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .draw_series(dns_queries_s.iter().filter(|t| **t <= duration_s).map(|t| {
            PathElement::new(
                vec![(*t, ymax * 0.93), (*t, ymax)],
                RGBColor(30, 80, 220).stroke_width(2),
            )
        }))
        .map_err(|e| err(e.to_string()))?
        .label("DNS query")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(30, 80, 220)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}
