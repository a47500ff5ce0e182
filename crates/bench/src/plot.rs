//! PNG plots of benchmark curves: throughput against file size per target (the papers' Figures
//! 1–4: 000 §4.2, 002 §4.2), SDET scripts/hour against concurrency (000 §4.3.3), and grouped bars
//! for per-phase results (004 Fig. 8 and 9).
//!
//! Data in, picture out: the caller builds [`LinePlot`]/[`BarPlot`] from results and this module
//! only draws. Text is rasterised with `ab_glyph` from a TTF found on the system at run time
//! (Debian `fonts-dejavu-core`), so the build needs no fontconfig; a missing font is an error,
//! not a panic.
//!
//! Log axes are drawn on a linear coordinate in log10 space with ticks chosen here, so one code
//! path serves both scales and tick labels stay readable (`1K … 4M`, `1 2 5 10 20 …`).

use std::path::Path;
use std::sync::OnceLock;

use ab_glyph::{Font as _, FontRef, PxScale, PxScaleFont, ScaleFont, point};
use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;
use plotters::style::FontStyle;

/// Image size: wide enough for a legend column beside a readable plot area.
pub const WIDTH: u32 = 1200;
pub const HEIGHT: u32 = 750;

const FONT: &str = "sans-serif";
const TITLE: Font = Font {
    px: 24.0,
    bold: true,
};
const TICK: Font = Font::new(16);
const DESC: Font = Font::new(18);
const LEGEND: Font = Font::new(16);
/// Room below and left of the plot area for tick labels and the axis description.
const X_AREA: u32 = 66;
const Y_AREA: u32 = 104;

/// One curve: `points` are `(x, y)` drawn in the given order; `spread` is `(x, min, max)` per
/// point over repetitions, drawn as vertical error bars.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub spread: Option<Vec<(f64, f64, f64)>>,
}

/// How x tick labels are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XFormat {
    /// Numbers as they are (`1`, `2.5`, `12k`).
    #[default]
    Plain,
    /// x is a size in bytes, written in binary units: `512`, `1K`, `64K`, `1M`. On a log axis
    /// the ticks fall on powers of two, as the papers' file-size axes do.
    Bytes,
}

/// A line chart of one or more series. On a log axis, points with a non-positive (or
/// non-finite) coordinate are skipped rather than failing: the micro benchmark's 0-byte files
/// cannot sit on a log file-size axis.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinePlot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub y_log: bool,
    pub x_fmt: XFormat,
    pub series: Vec<Series>,
}

/// A grouped bar chart: one group per category (e.g. benchmark phase), one bar per series in
/// each group. `series[i].1[g]` is the value for group `g`; `None`, a short vector, or (on a
/// log axis) a non-positive value leaves that bar out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BarPlot {
    pub title: String,
    pub y_label: String,
    pub y_log: bool,
    pub groups: Vec<String>,
    pub series: Vec<(String, Vec<Option<f64>>)>,
}

/// Renders `plot` as a PNG at `path` (`WIDTH`×`HEIGHT`). The parent directory must exist.
/// Where a rendering puts its plots and how its Markdown links them: a run's summary.md sits
/// beside its plots (`href` empty); the current-results page, docs/BENCHMARKS.md, links into
/// the folder its plots are written to (`href` = "bench/current/"). One place draws a plot and
/// writes its link, so the two cannot name different files.
pub struct Figures<'a> {
    pub dir: &'a Path,
    pub href: &'a str,
}

impl Figures<'_> {
    /// Figures written into `dir` and linked by bare file name (a run's own summary.md).
    pub fn beside(dir: &Path) -> Figures<'_> {
        Figures { dir, href: "" }
    }

    /// Draws `plot` into `file` and appends its Markdown image line, alt text `alt`, to `s`.
    pub fn line(&self, s: &mut String, alt: &str, file: &str, plot: &LinePlot) -> Result<()> {
        render_line(plot, &self.dir.join(file))?;
        self.link(s, alt, file);
        Ok(())
    }

    /// Draws `plot` into `file` and appends its Markdown image line to `s`.
    pub fn bars(&self, s: &mut String, alt: &str, file: &str, plot: &BarPlot) -> Result<()> {
        render_bars(plot, &self.dir.join(file))?;
        self.link(s, alt, file);
        Ok(())
    }

    fn link(&self, s: &mut String, alt: &str, file: &str) {
        s.push_str(&format!("\n![{alt}]({}{file})\n", self.href));
    }
}

pub fn render_line(plot: &LinePlot, path: &Path) -> Result<()> {
    faces()?;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    draw_line(plot, &root)?;
    root.present()
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

/// Renders `plot` as a PNG at `path` (`WIDTH`×`HEIGHT`). The parent directory must exist.
pub fn render_bars(plot: &BarPlot, path: &Path) -> Result<()> {
    faces()?;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    draw_bars(plot, &root)?;
    root.present()
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Fonts

/// Where Debian, Fedora and Arch put DejaVu Sans; the first readable one wins.
const FONT_DIRS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu",
    "/usr/share/fonts/dejavu-sans-fonts",
    "/usr/share/fonts/dejavu",
    "/usr/share/fonts/TTF",
];

/// The faces text is drawn with. `bold` is the regular face when no bold file exists.
struct Faces {
    regular: FontRef<'static>,
    bold: FontRef<'static>,
}

/// Loads the font once per process. Both ab_glyph and plotters want `'static` bytes, so the
/// file contents are leaked — once, a few hundred KiB.
fn faces() -> Result<&'static Faces> {
    static FACES: OnceLock<std::result::Result<Faces, String>> = OnceLock::new();
    FACES
        .get_or_init(load_faces)
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

fn load_faces() -> std::result::Result<Faces, String> {
    load_faces_from(FONT_DIRS)
}

fn load_faces_from(dirs: &[&str]) -> std::result::Result<Faces, String> {
    let found = dirs
        .iter()
        .map(|d| Path::new(d).join("DejaVuSans.ttf"))
        .find_map(|p| std::fs::read(&p).ok().map(|b| (p, b)));
    let Some((path, bytes)) = found else {
        return Err(format!(
            "no font for plot text: DejaVuSans.ttf not found in {} \
             (install the Debian package fonts-dejavu-core)",
            dirs.join(", ")
        ));
    };
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    let bad = |p: &Path| format!("{} is not a usable TrueType font", p.display());
    let regular = FontRef::try_from_slice(bytes).map_err(|_| bad(&path))?;
    // plotters lays out its (empty) mesh labels through its own font table, which must hold
    // a face even though every visible string is drawn by `draw_text`.
    plotters::style::register_font(FONT, FontStyle::Normal, bytes).map_err(|_| bad(&path))?;
    let bold = std::fs::read(path.with_file_name("DejaVuSans-Bold.ttf"))
        .ok()
        .and_then(|b| FontRef::try_from_slice(Box::leak(b.into_boxed_slice())).ok())
        .unwrap_or_else(|| regular.clone());
    Ok(Faces { regular, bold })
}

// ---------------------------------------------------------------------------------------------
// Text. Drawn here with ab_glyph rather than through plotters: plotters 0.3.7's ab_glyph path
// drops each glyph's left side bearing, which squeezes "rn" into "m" ("cairn" reads "caim").

#[derive(Debug, Clone, Copy)]
enum HAlign {
    Left,
    Center,
    Right,
}

#[derive(Debug, Clone, Copy)]
enum VAlign {
    Top,
    Center,
}

#[derive(Debug, Clone, Copy)]
struct Font {
    px: f32,
    bold: bool,
}

impl Font {
    const fn new(px: u32) -> Self {
        Font {
            px: px as f32,
            bold: false,
        }
    }

    fn face(self, faces: &'static Faces) -> PxScaleFont<&'static FontRef<'static>> {
        let f = if self.bold {
            &faces.bold
        } else {
            &faces.regular
        };
        f.as_scaled(PxScale::from(self.px))
    }
}

/// Width and height (ascent to descent) of `s` in pixels.
fn text_size(s: &str, font: Font) -> Result<(f32, f32)> {
    let sf = font.face(faces()?);
    let mut w = 0.0;
    let mut prev = None;
    for c in s.chars() {
        let id = sf.glyph_id(c);
        if let Some(p) = prev {
            w += sf.kern(p, id);
        }
        w += sf.h_advance(id);
        prev = Some(id);
    }
    Ok((w, sf.ascent() - sf.descent()))
}

/// Draws `s` anchored at `at` (pixels of `area`). `vertical` turns it a quarter anticlockwise,
/// reading bottom to top, with the anchor still describing the text's own box.
fn draw_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &str,
    font: Font,
    at: (i32, i32),
    align: (HAlign, VAlign),
    vertical: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let sf = font.face(faces()?);
    let (w, h) = text_size(s, font)?;
    let ox = match align.0 {
        HAlign::Left => 0.0,
        HAlign::Center => -w / 2.0,
        HAlign::Right => -w,
    };
    let oy = match align.1 {
        VAlign::Top => 0.0,
        VAlign::Center => -h / 2.0,
    };
    let mut pixels = Vec::new();
    let mut pen = 0.0;
    let mut prev = None;
    for c in s.chars() {
        let id = sf.glyph_id(c);
        if let Some(p) = prev {
            pen += sf.kern(p, id);
        }
        let glyph = id.with_scale_and_position(sf.scale(), point(pen, sf.ascent()));
        if let Some(outline) = sf.outline_glyph(glyph) {
            let b = outline.px_bounds();
            outline.draw(|gx, gy, cover| {
                if cover > 0.0 {
                    let tx = (b.min.x + gx as f32 + ox).round() as i32;
                    let ty = (b.min.y + gy as f32 + oy).round() as i32;
                    let p = if vertical {
                        (at.0 + ty, at.1 - tx)
                    } else {
                        (at.0 + tx, at.1 + ty)
                    };
                    pixels.push((p, cover.min(1.0)));
                }
            });
        }
        pen += sf.h_advance(id);
        prev = Some(id);
    }
    for (p, cover) in pixels {
        area.draw_pixel(p, &BLACK.mix(f64::from(cover)))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Series styles: colour AND marker shape differ, so curves stay apart in greyscale prints and
// for colour-blind readers.

const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),  // blue
    RGBColor(255, 127, 14),  // orange
    RGBColor(44, 160, 44),   // green
    RGBColor(214, 39, 40),   // red
    RGBColor(148, 103, 189), // purple
    RGBColor(140, 86, 75),   // brown
    RGBColor(227, 119, 194), // pink
    RGBColor(90, 90, 90),    // grey
    RGBColor(188, 189, 34),  // olive
    RGBColor(23, 190, 207),  // cyan
    RGBColor(0, 0, 0),       // black
    RGBColor(0, 0, 128),     // navy
];

#[derive(Debug, Clone, Copy)]
enum Shape {
    Circle,
    Square,
    TriangleUp,
    Diamond,
    TriangleDown,
    Cross,
    Plus,
}

#[derive(Debug, Clone, Copy)]
struct Marker {
    shape: Shape,
    filled: bool,
}

fn color_of(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// 12 distinct markers: five outline shapes filled then hollow, then × and +. Successive
/// series differ in shape, so neighbours never share one.
fn marker_of(i: usize) -> Marker {
    const SOLID: [Shape; 5] = [
        Shape::Circle,
        Shape::Square,
        Shape::TriangleUp,
        Shape::Diamond,
        Shape::TriangleDown,
    ];
    match i % 12 {
        k @ 0..5 => Marker {
            shape: SOLID[k],
            filled: true,
        },
        k @ 5..10 => Marker {
            shape: SOLID[(k - 5 + 2) % 5],
            filled: false,
        },
        10 => Marker {
            shape: Shape::Cross,
            filled: false,
        },
        _ => Marker {
            shape: Shape::Plus,
            filled: false,
        },
    }
}

/// Draws a marker centred at `c`, in pixels of `area`.
fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    c: (i32, i32),
    m: Marker,
    color: RGBColor,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let r = 6;
    let style = if m.filled {
        color.filled()
    } else {
        color.stroke_width(2)
    };
    let (x, y) = c;
    let poly: Vec<(i32, i32)> = match m.shape {
        Shape::Circle => {
            area.draw(&Circle::new(c, r, style))?;
            return Ok(());
        }
        Shape::Square => vec![
            (x - r + 1, y - r + 1),
            (x + r - 1, y - r + 1),
            (x + r - 1, y + r - 1),
            (x - r + 1, y + r - 1),
        ],
        Shape::TriangleUp => vec![(x, y - r - 1), (x + r, y + r - 1), (x - r, y + r - 1)],
        Shape::TriangleDown => vec![(x, y + r + 1), (x + r, y - r + 1), (x - r, y - r + 1)],
        Shape::Diamond => vec![(x, y - r - 1), (x + r, y), (x, y + r + 1), (x - r, y)],
        Shape::Cross => {
            area.draw(&PathElement::new(
                vec![(x - r, y - r), (x + r, y + r)],
                style,
            ))?;
            area.draw(&PathElement::new(
                vec![(x - r, y + r), (x + r, y - r)],
                style,
            ))?;
            return Ok(());
        }
        Shape::Plus => {
            area.draw(&PathElement::new(
                vec![(x - r - 1, y), (x + r + 1, y)],
                style,
            ))?;
            area.draw(&PathElement::new(
                vec![(x, y - r - 1), (x, y + r + 1)],
                style,
            ))?;
            return Ok(());
        }
    };
    if m.filled {
        area.draw(&Polygon::new(poly, style))?;
    } else {
        let mut closed = poly;
        closed.push(closed[0]);
        area.draw(&PathElement::new(closed, style))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Axes: a scale maps data to a linear plotting coordinate (identity or log10) and picks ticks.

#[derive(Debug, Clone, Copy, PartialEq)]
struct Scale {
    log: bool,
    bytes: bool,
}

impl Scale {
    /// The plotting coordinate of `v`, or `None` if `v` cannot be drawn on this scale.
    fn to_coord(self, v: f64) -> Option<f64> {
        if !v.is_finite() {
            return None;
        }
        if self.log {
            (v > 0.0).then(|| v.log10()).filter(|c| c.is_finite())
        } else {
            // Beyond this, padding the range overflows to infinity; no benchmark gets near.
            (v.abs() < 1e150).then_some(v)
        }
    }

    fn value(self, coord: f64) -> f64 {
        if self.log { 10f64.powf(coord) } else { coord }
    }

    fn label(self, coord: f64) -> String {
        let v = self.value(coord);
        if self.bytes {
            fmt_bytes(v)
        } else {
            fmt_plain(v)
        }
    }

    /// The coordinate range to show for data spanning `[lo, hi]` (coordinates), padded so no
    /// point sits on the frame. `zero_floor`: a linear axis of non-negative data starts at 0,
    /// as throughput axes should.
    fn range(self, lo: f64, hi: f64, zero_floor: bool) -> (f64, f64) {
        // No drawable data: an empty frame over 0..1 (log: 1..10).
        let (lo, hi) = if lo.is_finite() && hi.is_finite() && lo <= hi {
            (lo, hi)
        } else {
            (0.0, 1.0)
        };
        if self.log {
            if self.bytes {
                // File-size axes: hug the data; ticks are powers of two anyway.
                let pad = ((hi - lo) * 0.04).max(0.05);
                (lo - pad, hi + pad)
            } else {
                // Whole decades read best; one decade at least.
                let (a, b) = (lo.floor(), hi.ceil());
                if b - a < 1.0 { (a, a + 1.0) } else { (a, b) }
            }
        } else {
            let span = hi - lo;
            let pad = if span > 0.0 {
                span * 0.06
            } else {
                (hi.abs() * 0.1).max(1.0)
            };
            let a = if zero_floor && lo >= 0.0 {
                0.0
            } else {
                lo - pad
            };
            (a, hi + pad)
        }
    }

    /// (labelled ticks, light grid lines) within `[lo, hi]`.
    fn ticks(self, lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
        let inside = |v: &f64| *v >= lo - 1e-9 && *v <= hi + 1e-9;
        if !(lo.is_finite() && hi.is_finite() && lo < hi) {
            return (Vec::new(), Vec::new());
        }
        if !self.log {
            let step = nice_step((hi - lo) / 8.0, self.bytes);
            let first = (lo / step).ceil() as i64;
            let last = (hi / step).floor() as i64;
            if last.saturating_sub(first) > 100 {
                return (Vec::new(), Vec::new());
            }
            let major: Vec<f64> = (first..=last).map(|k| k as f64 * step).collect();
            let light = (first * 2 - 1..=last * 2 + 1)
                .map(|k| k as f64 * step / 2.0)
                .filter(inside)
                .collect();
            return (major, light);
        }
        if self.bytes {
            // Powers of two, thinned to at most ~13 labels.
            let l2 = std::f64::consts::LOG2_10;
            let (a, b) = ((lo * l2).ceil() as i64, (hi * l2).floor() as i64);
            let mut stride = 1;
            while (b - a) / stride > 12 {
                stride *= 2;
            }
            let all: Vec<f64> = (a..=b).map(|k| k as f64 / l2).collect();
            let major = (a..=b)
                .filter(|k| k.rem_euclid(stride) == 0)
                .map(|k| k as f64 / l2)
                .collect();
            return (major, all);
        }
        let (a, b) = (lo.floor() as i64, hi.ceil() as i64);
        let span = b - a;
        let mantissas: &[f64] = match span {
            ..=1 => &[1.0, 1.5, 2.0, 3.0, 5.0, 7.0],
            2..=3 => &[1.0, 2.0, 5.0],
            _ => &[1.0],
        };
        // At most ~10 labelled decades.
        let decade_stride = ((span + 9) / 10).max(1);
        let mut major = Vec::new();
        let mut light = Vec::new();
        for d in a..=b {
            for m in 1..10 {
                let c = d as f64 + (m as f64).log10();
                if span <= 6 && inside(&c) {
                    light.push(c);
                }
            }
            if d.rem_euclid(decade_stride) != 0 {
                continue;
            }
            for &m in mantissas {
                let c = d as f64 + m.log10();
                if inside(&c) {
                    major.push(c);
                }
            }
        }
        (major, light)
    }
}

/// A finished axis: the shown range in plotting coordinates, where its ticks and grid lines go,
/// and how a tick is labelled. Plotters' own `WithKeyPoints` cannot take a formatter, so the
/// axis formats its own labels.
struct Axis {
    lo: f64,
    hi: f64,
    major: Vec<f64>,
    light: Vec<f64>,
    labels: AxisLabels,
}

enum AxisLabels {
    Scale(Scale),
    /// Category names at coordinates 0.5, 1.5, …
    Groups(Vec<String>),
}

impl Axis {
    fn new(scale: Scale, lo: f64, hi: f64) -> Self {
        let (major, light) = scale.ticks(lo, hi);
        Axis {
            lo,
            hi,
            major,
            light,
            labels: AxisLabels::Scale(scale),
        }
    }
}

impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let t = (v - self.lo) / (self.hi - self.lo);
        let px = limit.0 as f64 + t * (limit.1 - limit.0) as f64;
        // `as` saturates; clamp first so a wild value cannot wrap a line across the image.
        px.clamp(-1e6, 1e6).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.major.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// plotters draws only tick marks and grid: its labels are empty, and `label_axes` writes them.
impl ValueFormatter<f64> for Axis {
    fn format_ext(&self, _: &f64) -> String {
        String::new()
    }
}

impl Axis {
    fn label(&self, c: &f64) -> String {
        match &self.labels {
            AxisLabels::Scale(s) => s.label(*c),
            AxisLabels::Groups(names) => {
                let g = (c - 0.5).round();
                if g >= 0.0 {
                    names.get(g as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            }
        }
    }
}

/// A step of 1, 2, 2.5 or 5 × 10^k (bytes: a power of two) at least `raw`.
fn nice_step(raw: f64, bytes: bool) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    if bytes && raw >= 1.0 {
        return 2f64.powi(raw.log2().ceil() as i32);
    }
    let mag = 10f64.powi(raw.log10().floor() as i32);
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= raw * 0.999 {
            return m * mag;
        }
    }
    10.0 * mag
}

/// Three significant digits, trailing zeros dropped; `k`/`M`/`G` from 10,000 up.
pub fn fmt_plain(v: f64) -> String {
    if !v.is_finite() {
        return String::new();
    }
    let a = v.abs();
    // 10000 and up get a suffix; below that, four digits read fine.
    for (from, div, suffix) in [(1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")] {
        if a >= from {
            return format!("{}{suffix}", fmt_sig(v / div));
        }
    }
    fmt_sig(v)
}

fn fmt_sig(v: f64) -> String {
    let a = v.abs();
    if a < 1e-12 {
        return "0".into();
    }
    let decimals = (2 - a.log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" { "0".into() } else { s }
}

/// Binary units: `512`, `1K`, `64K`, `1.5M`, `4M`, `1G`.
pub fn fmt_bytes(v: f64) -> String {
    if !v.is_finite() {
        return String::new();
    }
    let a = v.abs();
    for (div, suffix) in [
        (1u64 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ] {
        let div = div as f64;
        if a >= div * 0.999 {
            return format!("{}{suffix}", fmt_sig(v / div));
        }
    }
    fmt_sig(v.round())
}

// ---------------------------------------------------------------------------------------------
// Legend: its own column right of the plot area, so it never hides data.

enum Swatch {
    Line(Marker),
    Bar,
}

fn legend_width(labels: &[&str]) -> Result<u32> {
    let mut text = 0f32;
    for l in labels {
        text = text.max(text_size(l, LEGEND)?.0);
    }
    // Swatch + gaps; capped so the plot area keeps at least 60% of the width.
    Ok((text.ceil() as u32 + 84).clamp(140, WIDTH * 2 / 5))
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, Swatch)],
    top: i32,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    if entries.is_empty() {
        return Ok(());
    }
    let (w, _) = area.dim_in_pixel();
    let row = LEGEND.px as i32 + 10;
    let (x0, y0) = (6, top);
    let box_bottom = y0 + 10 + row * entries.len() as i32;
    area.draw(&Rectangle::new(
        [(x0, y0), (w as i32 - 8, box_bottom)],
        RGBColor(160, 160, 160).stroke_width(1),
    ))?;
    for (i, (label, swatch)) in entries.iter().enumerate() {
        let color = color_of(i);
        let cy = y0 + 5 + row * i as i32 + row / 2;
        let sx = x0 + 10;
        match swatch {
            Swatch::Line(m) => {
                area.draw(&PathElement::new(
                    vec![(sx, cy), (sx + 36, cy)],
                    color.stroke_width(2),
                ))?;
                draw_marker(area, (sx + 18, cy), *m, color)?;
            }
            Swatch::Bar => {
                area.draw(&Rectangle::new(
                    [(sx + 6, cy - 7), (sx + 30, cy + 7)],
                    color.filled(),
                ))?;
            }
        }
        draw_text(
            area,
            label,
            LEGEND,
            (sx + 46, cy),
            (HAlign::Left, VAlign::Center),
            false,
        )?;
    }
    Ok(())
}

/// Title across the whole image, then the plot and legend columns below it.
fn split_layout<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    labels: &[&str],
) -> Result<(DrawingArea<DB, Shift>, DrawingArea<DB, Shift>)>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (w, _) = root.dim_in_pixel();
    draw_text(
        root,
        title,
        TITLE,
        (w as i32 / 2, 10),
        (HAlign::Center, VAlign::Top),
        false,
    )?;
    let (_, body) = root.split_vertically(48);
    let legend_w = if labels.is_empty() {
        0
    } else {
        legend_width(labels)?
    };
    Ok(body.split_horizontally(w.saturating_sub(legend_w)))
}

/// Tick labels beside plotters' tick marks, and the axis descriptions beyond them.
fn label_axes<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &ChartContext<'_, DB, Cartesian2d<Axis, Axis>>,
    x_desc: &str,
    y_desc: &str,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let spec = chart.plotting_area().as_coord_spec();
    let (xa, ya) = (spec.x_spec(), spec.y_spec());

    // Category names shrink (to 11 px) rather than run into each other.
    let mut tick = TICK;
    if let AxisLabels::Groups(names) = &xa.labels {
        let slot = (xr.end - xr.start) as f32 / names.len().max(1) as f32 - 8.0;
        while tick.px > 11.0
            && names
                .iter()
                .any(|n| text_size(n, tick).is_ok_and(|(w, _)| w > slot))
        {
            tick.px -= 1.0;
        }
    }
    for c in &xa.major {
        let (px, _) = chart.backend_coord(&(*c, ya.lo));
        draw_text(
            root,
            &xa.label(c),
            tick,
            (px, yr.end + 8),
            (HAlign::Center, VAlign::Top),
            false,
        )?;
    }
    let mut widest = 0f32;
    for c in &ya.major {
        let (_, py) = chart.backend_coord(&(xa.lo, *c));
        let label = ya.label(c);
        widest = widest.max(text_size(&label, TICK)?.0);
        draw_text(
            root,
            &label,
            TICK,
            (xr.start - 10, py),
            (HAlign::Right, VAlign::Center),
            false,
        )?;
    }
    let mid_x = (xr.start + xr.end) / 2;
    let mid_y = (yr.start + yr.end) / 2;
    draw_text(
        root,
        x_desc,
        DESC,
        (mid_x, yr.end + 8 + TICK.px as i32 + 14),
        (HAlign::Center, VAlign::Top),
        false,
    )?;
    let desc_h = text_size(y_desc, DESC)?.1;
    let desc_x = xr.start - 10 - widest.ceil() as i32 - 14 - (desc_h / 2.0) as i32;
    draw_text(
        root,
        y_desc,
        DESC,
        (desc_x.max(desc_h as i32 / 2 + 2), mid_y),
        (HAlign::Center, VAlign::Center),
        true,
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Line plots

fn draw_line<DB: DrawingBackend>(plot: &LinePlot, root: &DrawingArea<DB, Shift>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let xs = Scale {
        log: plot.x_log,
        bytes: plot.x_fmt == XFormat::Bytes,
    };
    let ys = Scale {
        log: plot.y_log,
        bytes: false,
    };

    // Everything drawable, in plotting coordinates; what cannot be drawn is dropped here.
    struct Curve {
        points: Vec<(f64, f64)>,
        bars: Vec<(f64, f64, f64)>,
    }
    let curves: Vec<Curve> = plot
        .series
        .iter()
        .map(|s| Curve {
            points: s
                .points
                .iter()
                .filter_map(|&(x, y)| Some((xs.to_coord(x)?, ys.to_coord(y)?)))
                .collect(),
            bars: s
                .spread
                .iter()
                .flatten()
                .filter_map(|&(x, lo, hi)| {
                    let (lo, hi) = (ys.to_coord(lo)?, ys.to_coord(hi)?);
                    Some((xs.to_coord(x)?, lo.min(hi), lo.max(hi)))
                })
                .collect(),
        })
        .collect();

    let mut bx = (f64::INFINITY, f64::NEG_INFINITY);
    let mut by = (f64::INFINITY, f64::NEG_INFINITY);
    for c in &curves {
        for &(x, y) in &c.points {
            bx = (bx.0.min(x), bx.1.max(x));
            by = (by.0.min(y), by.1.max(y));
        }
        for &(x, lo, hi) in &c.bars {
            bx = (bx.0.min(x), bx.1.max(x));
            by = (by.0.min(lo), by.1.max(hi));
        }
    }
    let (x0, x1) = xs.range(bx.0, bx.1, false);
    let (y0, y1) = ys.range(by.0, by.1, true);

    let labels: Vec<&str> = plot.series.iter().map(|s| s.label.as_str()).collect();
    let (left, right) = split_layout(root, &plot.title, &labels)?;

    let mut chart = ChartBuilder::on(&left)
        .margin(12)
        .margin_right(20)
        .x_label_area_size(X_AREA)
        .y_label_area_size(Y_AREA)
        .build_cartesian_2d(Axis::new(xs, x0, x1), Axis::new(ys, y0, y1))?;
    chart
        .configure_mesh()
        .bold_line_style(RGBColor(200, 200, 200).stroke_width(1))
        .light_line_style(RGBColor(238, 238, 238).stroke_width(1))
        .draw()?;
    label_axes(root, &chart, &plot.x_label, &plot.y_label)?;

    for (i, c) in curves.iter().enumerate() {
        let color = color_of(i);
        chart.draw_series(LineSeries::new(
            c.points.iter().copied(),
            color.stroke_width(2),
        ))?;
    }
    // Error bars and markers are drawn in pixels on the whole image (so their size does not
    // depend on the scale), after all lines so no curve hides another's markers.
    for (i, c) in curves.iter().enumerate() {
        let color = color_of(i);
        for &(x, lo, hi) in &c.bars {
            let (px, plo) = chart.backend_coord(&(x, lo));
            let (_, phi) = chart.backend_coord(&(x, hi));
            let st = color.stroke_width(1);
            root.draw(&PathElement::new(vec![(px, plo), (px, phi)], st))?;
            root.draw(&PathElement::new(vec![(px - 4, plo), (px + 4, plo)], st))?;
            root.draw(&PathElement::new(vec![(px - 4, phi), (px + 4, phi)], st))?;
        }
        for &p in &c.points {
            let pc = chart.backend_coord(&p);
            draw_marker(root, pc, marker_of(i), color)?;
        }
    }

    let entries: Vec<(String, Swatch)> = plot
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.label.clone(), Swatch::Line(marker_of(i))))
        .collect();
    draw_legend(&right, &entries, 12)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Grouped bars

fn draw_bars<DB: DrawingBackend>(plot: &BarPlot, root: &DrawingArea<DB, Shift>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let ys = Scale {
        log: plot.y_log,
        bytes: false,
    };
    let n_groups = plot.groups.len();
    let n_series = plot.series.len();
    let value = |s: usize, g: usize| -> Option<f64> {
        plot.series[s]
            .1
            .get(g)
            .copied()
            .flatten()
            .and_then(|v| ys.to_coord(v))
    };

    let mut by = (f64::INFINITY, f64::NEG_INFINITY);
    for s in 0..n_series {
        for g in 0..n_groups {
            if let Some(v) = value(s, g) {
                by = (by.0.min(v), by.1.max(v));
            }
        }
    }
    // Bars grow from zero on a linear axis, so zero must be in range.
    if !ys.log && by.0.is_finite() {
        by = (by.0.min(0.0), by.1.max(0.0));
    }
    let (y0, y1) = ys.range(by.0, by.1, true);

    let labels: Vec<&str> = plot.series.iter().map(|s| s.0.as_str()).collect();
    let (left, right) = split_layout(root, &plot.title, &labels)?;

    let x1 = n_groups.max(1) as f64;
    let centres: Vec<f64> = (0..n_groups).map(|g| g as f64 + 0.5).collect();
    let x_axis = Axis {
        lo: 0.0,
        hi: x1,
        major: centres,
        light: Vec::new(),
        labels: AxisLabels::Groups(plot.groups.clone()),
    };
    let mut chart = ChartBuilder::on(&left)
        .margin(12)
        .margin_right(20)
        .x_label_area_size(X_AREA)
        .y_label_area_size(Y_AREA)
        .build_cartesian_2d(x_axis, Axis::new(ys, y0, y1))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(RGBColor(200, 200, 200).stroke_width(1))
        .light_line_style(RGBColor(238, 238, 238).stroke_width(1))
        .draw()?;
    label_axes(root, &chart, "", &plot.y_label)?;

    // 80% of each group is bars, 20% the gap between groups.
    let width = 0.8 / n_series.max(1) as f64;
    let base = if ys.log { y0 } else { 0.0 };
    for s in 0..n_series {
        let color = color_of(s);
        let rects = (0..n_groups).filter_map(|g| {
            let v = value(s, g)?;
            let left = g as f64 + 0.1 + s as f64 * width;
            Some([(left, base), (left + width, v)])
        });
        for r in rects {
            chart.draw_series(std::iter::once(Rectangle::new(r, color.filled())))?;
            chart.draw_series(std::iter::once(Rectangle::new(
                r,
                RGBColor(60, 60, 60).stroke_width(1),
            )))?;
        }
    }

    let entries: Vec<(String, Swatch)> = plot
        .series
        .iter()
        .map(|(l, _)| (l.clone(), Swatch::Bar))
        .collect();
    draw_legend(&right, &entries, 12)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The width and height from a PNG's IHDR chunk (PNG spec §11.2.2).
    fn png_size(path: &Path) -> (u32, u32) {
        let b = std::fs::read(path).unwrap();
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
        assert_eq!(&b[12..16], b"IHDR");
        let w = u32::from_be_bytes(b[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(b[20..24].try_into().unwrap());
        (w, h)
    }

    /// Renders into memory so pixels can be inspected without a PNG decoder.
    fn pixels_line(plot: &LinePlot) -> Result<Vec<u8>> {
        faces()?;
        let mut buf = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
            draw_line(plot, &root)?;
            root.present()?;
        }
        Ok(buf)
    }

    fn pixels_bars(plot: &BarPlot) -> Result<Vec<u8>> {
        faces()?;
        let mut buf = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
            draw_bars(plot, &root)?;
            root.present()?;
        }
        Ok(buf)
    }

    fn count_color(buf: &[u8], c: RGBColor) -> usize {
        buf.chunks(3).filter(|p| p == &[c.0, c.1, c.2]).count()
    }

    fn non_white(buf: &[u8]) -> usize {
        buf.chunks(3).filter(|p| p != &[255, 255, 255]).count()
    }

    fn micro_like(n_series: usize) -> LinePlot {
        let sizes: Vec<f64> = (0..=12).map(|k| 1024.0 * 2f64.powi(k)).collect();
        LinePlot {
            title: "Create throughput".into(),
            x_label: "file size (bytes)".into(),
            y_label: "throughput (MB/s)".into(),
            x_log: true,
            y_log: true,
            x_fmt: XFormat::Bytes,
            series: (0..n_series)
                .map(|i| Series {
                    label: format!("target {i}"),
                    points: sizes
                        .iter()
                        .map(|&s| (s, (s / 1024.0).sqrt() * (i + 1) as f64))
                        .collect(),
                    spread: Some(
                        sizes
                            .iter()
                            .map(|&s| {
                                let y = (s / 1024.0).sqrt() * (i + 1) as f64;
                                (s, y * 0.9, y * 1.1)
                            })
                            .collect(),
                    ),
                })
                .collect(),
        }
    }

    fn phases() -> BarPlot {
        BarPlot {
            title: "Large file".into(),
            y_label: "throughput (MB/s)".into(),
            y_log: false,
            groups: [
                "seq write",
                "seq read",
                "rand write",
                "rand read",
                "re-read",
            ]
            .map(String::from)
            .to_vec(),
            series: vec![
                (
                    "cairn sync".into(),
                    vec![Some(10.0), Some(50.0), None, Some(3.0), Some(40.0)],
                ),
                (
                    "ext4".into(),
                    vec![Some(200.0), Some(400.0), Some(20.0), Some(8.0), Some(500.0)],
                ),
            ],
        }
    }

    #[test]
    fn plot_line_png_has_size_and_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("micro.png");
        render_line(&micro_like(3), &path).unwrap();
        assert_eq!(png_size(&path), (WIDTH, HEIGHT));
        // A blank 1200×750 white PNG compresses to a few KiB; a plot with text does not.
        assert!(std::fs::metadata(&path).unwrap().len() > 20_000);
    }

    #[test]
    fn plot_bars_png_has_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("phases.png");
        render_bars(&phases(), &path).unwrap();
        assert_eq!(png_size(&path), (WIDTH, HEIGHT));
    }

    #[test]
    fn plot_every_series_colour_is_drawn() {
        let buf = pixels_line(&micro_like(9)).unwrap();
        assert!(non_white(&buf) > 20_000);
        for i in 0..9 {
            assert!(count_color(&buf, color_of(i)) > 100, "series {i} not drawn");
        }
        let buf = pixels_bars(&phases()).unwrap();
        for i in 0..2 {
            assert!(
                count_color(&buf, color_of(i)) > 1000,
                "bar series {i} not drawn"
            );
        }
    }

    #[test]
    fn plot_legend_sits_right_of_the_plot_area() {
        // One series whose data lies everywhere in the plot: the legend column must still show
        // its colour, and nothing of it right of the legend's left edge but the legend itself.
        let mut p = micro_like(1);
        p.series[0].spread = None;
        let buf = pixels_line(&p).unwrap();
        let c = color_of(0);
        let cols_with_colour: Vec<u32> = (0..WIDTH)
            .filter(|&x| {
                (0..HEIGHT).any(|y| {
                    let i = ((y * WIDTH + x) * 3) as usize;
                    buf[i..i + 3] == [c.0, c.1, c.2]
                })
            })
            .collect();
        let max_x = *cols_with_colour.iter().max().unwrap();
        assert!(max_x > WIDTH - 200, "legend swatch missing on the right");
        // There is a white gap between the curve's last marker and the legend swatch.
        let gap = cols_with_colour.windows(2).any(|w| w[1] - w[0] > 20);
        assert!(gap, "legend overlaps the plot area");
    }

    #[test]
    fn plot_hostile_input_never_panics() {
        let dir = tempfile::tempdir().unwrap();
        let nasty = vec![
            (f64::NAN, 1.0),
            (1.0, f64::NAN),
            (f64::INFINITY, 2.0),
            (0.0, 0.0),
            (-5.0, -1.0),
            (1e308, 1e-308),
        ];
        let cases = [
            LinePlot::default(),
            LinePlot {
                x_log: true,
                y_log: true,
                x_fmt: XFormat::Bytes,
                series: vec![
                    Series::default(),
                    Series {
                        label: String::new(),
                        points: nasty.clone(),
                        spread: Some(vec![(f64::NAN, 1.0, -1.0), (0.0, 0.0, 0.0)]),
                    },
                ],
                ..Default::default()
            },
            LinePlot {
                series: vec![Series {
                    label: "flat".into(),
                    points: vec![(3.0, 7.0), (3.0, 7.0)],
                    spread: None,
                }],
                ..Default::default()
            },
            LinePlot {
                series: vec![Series {
                    label: "nasty".into(),
                    points: nasty,
                    spread: None,
                }],
                ..Default::default()
            },
            LinePlot {
                y_log: true,
                series: vec![Series {
                    label: "zeros".into(),
                    points: vec![(1.0, 0.0), (2.0, 0.0)],
                    spread: None,
                }],
                ..Default::default()
            },
        ];
        // Undrawable points are skipped, so every case still yields a (possibly empty) plot.
        for (i, p) in cases.iter().enumerate() {
            let path = dir.path().join(format!("l{i}.png"));
            render_line(p, &path).unwrap_or_else(|e| panic!("line case {i}: {e:#}"));
            assert_eq!(png_size(&path), (WIDTH, HEIGHT));
        }
        let bars = [
            BarPlot::default(),
            BarPlot {
                y_log: true,
                groups: vec!["a".into(), "b".into()],
                series: vec![
                    ("zero".into(), vec![Some(0.0), Some(f64::NAN)]),
                    ("short".into(), vec![]),
                    ("long".into(), vec![Some(1.0); 9]),
                ],
                ..Default::default()
            },
            BarPlot {
                groups: vec!["neg".into()],
                series: vec![("n".into(), vec![Some(-3.0)])],
                ..Default::default()
            },
        ];
        for (i, p) in bars.iter().enumerate() {
            let path = dir.path().join(format!("b{i}.png"));
            render_bars(p, &path).unwrap_or_else(|e| panic!("bar case {i}: {e:#}"));
            assert_eq!(png_size(&path), (WIDTH, HEIGHT));
        }
        // A path that cannot be written is an error, not a panic.
        assert!(render_line(&micro_like(1), &dir.path().join("no/such/dir/x.png")).is_err());
    }

    /// Example plots for a person to look at (`cargo test -p cairn-bench plot_examples --
    /// --ignored`): written to $CAIRN_PLOT_EXAMPLES or /tmp/plots.
    #[test]
    #[ignore]
    fn plot_examples() {
        let dir = std::env::var_os("CAIRN_PLOT_EXAMPLES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/tmp/plots".into());
        std::fs::create_dir_all(&dir).unwrap();
        let sizes: Vec<f64> = [
            0u64, 1, 2, 4, 8, 16, 32, 64, 96, 104, 128, 256, 512, 1024, 2048, 4096,
        ]
        .iter()
        .map(|k| (k * 1024) as f64)
        .collect();
        let targets = [
            ("cairn sync", 0.6),
            ("cairn async", 3.0),
            ("ext4", 8.0),
            ("ext4-sync", 0.4),
            ("ext2", 9.0),
            ("xfs", 7.0),
            ("fuse2fs", 1.2),
            ("passthrough", 4.0),
            ("mergerfs", 3.5),
        ];
        let micro = LinePlot {
            title: "Micro: create throughput vs file size".into(),
            x_label: "file size".into(),
            y_label: "throughput (MB/s)".into(),
            x_log: true,
            y_log: true,
            x_fmt: XFormat::Bytes,
            series: targets
                .iter()
                .map(|&(name, k)| {
                    let y = |s: f64| k * 40.0 * (s / 1024.0) / (s / 1024.0 + 30.0);
                    Series {
                        label: name.into(),
                        points: sizes.iter().map(|&s| (s, y(s))).collect(),
                        spread: Some(
                            sizes
                                .iter()
                                .map(|&s| (s, y(s) * 0.85, y(s) * 1.1))
                                .collect(),
                        ),
                    }
                })
                .collect(),
        };
        render_line(&micro, &dir.join("micro.png")).unwrap();
        let sdet = LinePlot {
            title: "SDET-like: throughput vs concurrency".into(),
            x_label: "concurrent scripts".into(),
            y_label: "scripts/hour".into(),
            x_log: false,
            y_log: false,
            x_fmt: XFormat::Plain,
            series: targets[..4]
                .iter()
                .map(|&(name, k)| Series {
                    label: name.into(),
                    points: [1.0, 2.0, 4.0, 8.0]
                        .iter()
                        .map(|&n: &f64| (n, k * 1500.0 * n.sqrt()))
                        .collect(),
                    spread: None,
                })
                .collect(),
        };
        render_line(&sdet, &dir.join("sdet.png")).unwrap();
        let mut large = phases();
        large.title = "Large file (100 MB): throughput per phase".into();
        large.series = targets
            .iter()
            .map(|&(name, k)| {
                (
                    name.to_string(),
                    [30.0, 90.0, 4.0, 6.0, 95.0]
                        .iter()
                        .map(|v| Some(v * k))
                        .collect(),
                )
            })
            .collect();
        render_bars(&large, &dir.join("phases.png")).unwrap();
        large.y_log = true;
        large.title += " (log)";
        render_bars(&large, &dir.join("phases-log.png")).unwrap();
        for f in ["micro.png", "sdet.png", "phases.png", "phases-log.png"] {
            assert_eq!(png_size(&dir.join(f)), (WIDTH, HEIGHT));
        }
    }

    #[test]
    fn plot_missing_font_is_an_error_naming_the_package() {
        let Err(e) = load_faces_from(&["/nonexistent/fonts"]) else {
            panic!("loaded a font from nowhere");
        };
        assert!(e.contains("fonts-dejavu-core"), "{e}");
    }

    #[test]
    fn plot_tick_labels() {
        assert_eq!(fmt_bytes(1024.0), "1K");
        assert_eq!(fmt_bytes(65536.0), "64K");
        assert_eq!(fmt_bytes(4.0 * 1048576.0), "4M");
        assert_eq!(fmt_bytes(1.5 * 1048576.0), "1.5M");
        assert_eq!(fmt_bytes(512.0), "512");
        assert_eq!(fmt_plain(0.05), "0.05");
        assert_eq!(fmt_plain(2500.0), "2500");
        assert_eq!(fmt_plain(12000.0), "12k");
        assert_eq!(fmt_plain(199.99999), "200");
        assert_eq!(fmt_plain(3e6), "3M");
        // Log byte axis from 1K to 4M: ticks on every power of two, labelled 1K … 4M.
        let s = Scale {
            log: true,
            bytes: true,
        };
        let (lo, hi) = s.range(1024f64.log10(), 4194304f64.log10(), false);
        let (major, _) = s.ticks(lo, hi);
        let labels: Vec<String> = major.iter().map(|&c| s.label(c)).collect();
        assert_eq!(labels.first().unwrap(), "1K");
        assert_eq!(labels.last().unwrap(), "4M");
        assert_eq!(labels.len(), 13);
        // Log plain axis over 0.3..40: three decades, labelled in 1-2-5 steps.
        let s = Scale {
            log: true,
            bytes: false,
        };
        let (lo, hi) = s.range(0.3f64.log10(), 40f64.log10(), false);
        let labels: Vec<String> = s.ticks(lo, hi).0.iter().map(|&c| s.label(c)).collect();
        assert_eq!(labels[..4], ["0.1", "0.2", "0.5", "1"]);
        assert_eq!(labels.last().unwrap(), "100");
        // Five decades and more: decades only.
        let labels: Vec<String> = s.ticks(-1.0, 4.0).0.iter().map(|&c| s.label(c)).collect();
        assert_eq!(labels, ["0.1", "1", "10", "100", "1000", "10k"]);
    }
}
