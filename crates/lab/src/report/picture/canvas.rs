//! Two surfaces for one drawing: SVG text, and an RGB raster encoded as PNG with glyphs from a
//! TrueType font found on the machine. The picture is rectangles and text only, so both are
//! small and draw the same layout pixel for pixel.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ab_glyph::{point, Font, FontVec, PxScale, ScaleFont};

/// An RGB colour.
pub type Rgb = (u8, u8, u8);

/// What the picture is drawn on.
pub trait Canvas {
    /// Fills a rectangle (pixels, origin top left).
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, color: Rgb);
    /// Writes `text` with its baseline at `y`, starting at `x`.
    fn text(&mut self, x: f64, y: f64, size: f64, text: &str, color: Rgb, bold: bool);
}

/// A canvas that draws nothing, for the layout alone.
pub struct Nothing;

impl Canvas for Nothing {
    fn rect(&mut self, _: f64, _: f64, _: f64, _: f64, _: Rgb) {}
    fn text(&mut self, _: f64, _: f64, _: f64, _: &str, _: Rgb, _: bool) {}
}

/// An SVG document being written.
pub struct Svg {
    body: String,
    width: u32,
    height: u32,
}

impl Svg {
    /// An empty white document.
    pub fn new(width: u32, height: u32) -> Svg {
        let mut s = Svg {
            body: String::new(),
            width,
            height,
        };
        s.rect(
            0.0,
            0.0,
            f64::from(width),
            f64::from(height),
            (255, 255, 255),
        );
        s
    }

    /// The finished document.
    pub fn finish(self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, Verdana, sans-serif\">\n{}</svg>\n",
            self.body,
            w = self.width,
            h = self.height
        )
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Canvas for Svg {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, (r, g, b): Rgb) {
        let _ = writeln!(
            self.body,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"#{r:02x}{g:02x}{b:02x}\"/>"
        );
    }

    fn text(&mut self, x: f64, y: f64, size: f64, text: &str, (r, g, b): Rgb, bold: bool) {
        let weight = if bold { " font-weight=\"bold\"" } else { "" };
        let _ = writeln!(
            self.body,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size:.1}\"{weight} fill=\"#{r:02x}{g:02x}{b:02x}\">{}</text>",
            escape(text)
        );
    }
}

/// An RGB raster.
pub struct Raster {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
    font: &'static FontVec,
}

impl Raster {
    /// A white raster drawing text with `font`.
    pub fn new(width: u32, height: u32, font: &'static FontVec) -> Raster {
        Raster {
            width,
            height,
            pixels: vec![255; width as usize * height as usize * 3],
            font,
        }
    }

    fn blend(&mut self, x: i64, y: i64, (r, g, b): Rgb, alpha: f32) {
        if x < 0 || y < 0 || x >= i64::from(self.width) || y >= i64::from(self.height) {
            return;
        }
        let i = (y as usize * self.width as usize + x as usize) * 3;
        let a = alpha.clamp(0.0, 1.0);
        for (k, c) in [r, g, b].into_iter().enumerate() {
            let old = f32::from(self.pixels[i + k]);
            self.pixels[i + k] = (old + (f32::from(c) - old) * a).round() as u8;
        }
    }

    /// The raster as a PNG file.
    pub fn encode_png(&self) -> Result<Vec<u8>, png::EncodingError> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&self.pixels)?;
        writer.finish()?;
        Ok(out)
    }
}

impl Canvas for Raster {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, color: Rgb) {
        let (x0, y0) = (x.round() as i64, y.round() as i64);
        let (x1, y1) = ((x + w).round() as i64, (y + h).round() as i64);
        for py in y0.max(0)..y1.min(i64::from(self.height)) {
            for px in x0.max(0)..x1.min(i64::from(self.width)) {
                self.blend(px, py, color, 1.0);
            }
        }
    }

    fn text(&mut self, x: f64, y: f64, size: f64, text: &str, color: Rgb, bold: bool) {
        let font = self.font;
        let scaled = font.as_scaled(PxScale::from(size as f32));
        // A second pass half a pixel to the right stands in for a bold face.
        let passes: &[f32] = if bold { &[0.0, 0.5] } else { &[0.0] };
        for dx in passes {
            let mut caret = x as f32 + dx;
            let mut prev = None;
            for c in text.chars() {
                let id = font.glyph_id(c);
                if let Some(p) = prev {
                    caret += scaled.kern(p, id);
                }
                let glyph = id.with_scale_and_position(scaled.scale(), point(caret, y as f32));
                if let Some(outline) = font.outline_glyph(glyph) {
                    let bounds = outline.px_bounds();
                    let mut dots = Vec::new();
                    outline.draw(|gx, gy, coverage| dots.push((gx, gy, coverage)));
                    for (gx, gy, coverage) in dots {
                        let px = bounds.min.x as i64 + i64::from(gx);
                        let py = bounds.min.y as i64 + i64::from(gy);
                        self.blend(px, py, color, coverage);
                    }
                }
                caret += scaled.h_advance(id);
                prev = Some(id);
            }
        }
    }
}

/// Where a sans-serif TrueType font usually is (Debian's fonts-dejavu-core first).
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// The font for PNG text: `UPKEEP_FONT` if set, else the first of [`FONT_PATHS`] that loads.
pub fn font() -> Result<&'static FontVec, Vec<PathBuf>> {
    static FONT: OnceLock<Result<FontVec, Vec<PathBuf>>> = OnceLock::new();
    FONT.get_or_init(|| {
        let mut tried = Vec::new();
        let from_env = std::env::var_os("UPKEEP_FONT").map(PathBuf::from);
        for path in from_env
            .into_iter()
            .chain(FONT_PATHS.iter().map(|p| Path::new(p).to_owned()))
        {
            if let Some(f) = std::fs::read(&path)
                .ok()
                .and_then(|b| FontVec::try_from_vec(b).ok())
            {
                return Ok(f);
            }
            tried.push(path);
        }
        Err(tried)
    })
    .as_ref()
    .map_err(Clone::clone)
}
