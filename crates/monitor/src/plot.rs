//! Signatures drawn as SVG: per component, mean latency against frame size beside
//! how many frames of each size took that part of the path.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::signature::{size_class_label, Point, Signature};
use crate::{Component, MonitorError};

/// Colour of the run's series.
pub const RUN_COLOR: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
/// Colour of the baseline's series.
pub const BASELINE_COLOR: RGBColor = RGBColor(0xd6, 0x27, 0x28);

const WIDTH: u32 = 1200;
const ROW_HEIGHT: u32 = 330;
const TITLE_HEIGHT: u32 = 60;

/// The signature of a run (and of its baseline, when given) as one SVG document:
/// a row per component, mean latency (log scale, µs) against size class on the left,
/// frames per size class (log scale) on the right.
///
/// # Errors
/// [`MonitorError::Plot`] when the plotting library fails.
pub fn signature_svg(
    title: &str,
    run: &Signature,
    baseline: Option<&Signature>,
) -> Result<String, MonitorError> {
    let mut svg = String::new();
    let rows = Component::ALL.len() as u32;
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, TITLE_HEIGHT + rows * ROW_HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (head, body) = root.split_vertically(TITLE_HEIGHT);
        draw_title(&head, title, baseline.is_some())?;
        let panels = body.split_evenly((Component::ALL.len(), 2));
        let classes = class_range(run, baseline);
        for (i, component) in Component::ALL.into_iter().enumerate() {
            let sides = Sides { run: run.points(component), baseline: baseline.map(|b| b.points(component)) };
            draw_latency(&panels[2 * i], component, &sides, classes)?;
            draw_frequency(&panels[2 * i + 1], component, &sides, classes)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// One component's points of the run and of the baseline.
struct Sides<'a> {
    run: &'a [Point],
    baseline: Option<&'a [Point]>,
}

impl Sides<'_> {
    fn all(&self) -> impl Iterator<Item = &Point> {
        self.run.iter().chain(self.baseline.unwrap_or(&[]))
    }
}

type Panel<'a, 'b> = DrawingArea<SVGBackend<'a>, Shift>;

fn draw_title(area: &Panel<'_, '_>, title: &str, with_baseline: bool) -> Result<(), MonitorError> {
    area.draw(&Text::new(title.to_string(), (20, 8), ("sans-serif", 22).into_font())).map_err(plot_error)?;
    let mut legend = vec![("run", RUN_COLOR)];
    if with_baseline {
        legend.push(("baseline", BASELINE_COLOR));
    }
    for (i, (name, color)) in legend.into_iter().enumerate() {
        let x = 20 + 140 * i as i32;
        area.draw(&Rectangle::new([(x, 38), (x + 14, 52)], color.filled())).map_err(plot_error)?;
        area.draw(&Text::new(name, (x + 20, 37), ("sans-serif", 15).into_font())).map_err(plot_error)?;
    }
    Ok(())
}

/// Size classes every panel shows, so that panels line up.
fn class_range(run: &Signature, baseline: Option<&Signature>) -> (u8, u8) {
    let classes = run
        .series
        .iter()
        .chain(baseline.into_iter().flat_map(|b| &b.series))
        .flat_map(|s| s.points.iter().map(|p| p.size_class));
    let (lo, hi) = classes.fold((u8::MAX, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
    if lo > hi {
        (0, 1)
    } else {
        (lo, hi)
    }
}

fn x_axis(classes: (u8, u8)) -> std::ops::Range<f64> {
    f64::from(classes.0) - 0.5..f64::from(classes.1) + 0.5
}

/// Labels only whole size classes, by their lower bound.
fn class_label(x: &f64) -> String {
    let class = x.round();
    if (x - class).abs() > 1e-6 || !(0.0..=255.0).contains(&class) {
        return String::new();
    }
    let label = size_class_label(class as u8);
    label.trim_start_matches('[').split(',').next().unwrap_or(&label).to_string()
}

/// An axis value without trailing zeros: `0.05`, `3`, `250`, `12000`.
fn short_number(v: &f64) -> String {
    if *v >= 10.0 {
        format!("{v:.0}")
    } else {
        let text = format!("{v:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A panel with size classes across and a log scale up, its grid and labels drawn.
fn log_chart<'a, 'b>(
    area: &'a Panel<'b, '_>,
    caption: String,
    classes: (u8, u8),
    y: std::ops::Range<f64>,
    y_desc: &str,
) -> Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>, MonitorError> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_axis(classes), y.log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_labels(usize::from(classes.1 - classes.0) + 2)
        .x_label_formatter(&class_label)
        .x_desc("frame size")
        .y_desc(y_desc)
        .y_labels(6)
        .y_label_formatter(&short_number)
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(plot_error)?;
    Ok(chart)
}

fn draw_latency(
    area: &Panel<'_, '_>,
    component: Component,
    sides: &Sides<'_>,
    classes: (u8, u8),
) -> Result<(), MonitorError> {
    let us = |p: &Point| p.mean_ns / 1_000.0;
    let (lo, hi) = sides.all().map(us).fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let y = if lo > hi { 0.1..10.0 } else { (lo / 2.0).max(1e-3)..(hi * 2.0).max(1e-2) };
    let caption = format!("{}: mean latency", component.name());
    let mut chart = log_chart(area, caption, classes, y, "µs")?;
    let mut draw = |points: &[Point], color: RGBColor| -> Result<(), MonitorError> {
        let xy: Vec<(f64, f64)> = points.iter().map(|p| (f64::from(p.size_class), us(p))).collect();
        chart.draw_series(LineSeries::new(xy.clone(), color.stroke_width(2))).map_err(plot_error)?;
        chart.draw_series(xy.into_iter().map(|c| Circle::new(c, 4, color.filled()))).map_err(plot_error)?;
        Ok(())
    };
    draw(sides.run, RUN_COLOR)?;
    if let Some(b) = sides.baseline {
        draw(b, BASELINE_COLOR)?;
    }
    Ok(())
}

fn draw_frequency(
    area: &Panel<'_, '_>,
    component: Component,
    sides: &Sides<'_>,
    classes: (u8, u8),
) -> Result<(), MonitorError> {
    let most = sides.all().map(|p| p.frames).max().unwrap_or(1);
    let caption = format!("{}: frames per size", component.name());
    let mut chart = log_chart(area, caption, classes, 0.5..most as f64 * 2.0, "frames")?;
    // Run and baseline bars side by side within each class.
    let bars = |points: &[Point], left: f64, color: RGBColor| {
        points
            .iter()
            .map(move |p| {
                let x = f64::from(p.size_class) + left;
                Rectangle::new([(x, 0.5), (x + 0.35, p.frames as f64)], color.filled())
            })
            .collect::<Vec<_>>()
    };
    let run_left = if sides.baseline.is_some() { -0.37 } else { -0.17 };
    chart.draw_series(bars(sides.run, run_left, RUN_COLOR)).map_err(plot_error)?;
    if let Some(b) = sides.baseline {
        chart.draw_series(bars(b, 0.02, BASELINE_COLOR)).map_err(plot_error)?;
    }
    Ok(())
}

fn plot_error<E: std::error::Error>(e: E) -> MonitorError {
    MonitorError::Plot(e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{Key, Recorder};

    fn signature(scale: u64) -> Signature {
        let mut r = Recorder::default();
        for component in Component::ALL {
            for (bytes, ns) in [(8u64, 2_000u64), (1_000, 5_000), (1 << 20, 900_000)] {
                for _ in 0..3 {
                    r.record(Key { link: 1, up: true, tag: 1, program: 0 }, component, bytes, ns * scale);
                }
            }
        }
        Signature::of(&r.report(), None)
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    /// (polylines, circles, bars) drawn in `color`, and every text of the document.
    fn parse(svg: &str, color: RGBColor) -> (Vec<usize>, usize, usize, Vec<String>) {
        let doc = roxmltree::Document::parse(svg).unwrap();
        let color = hex(color);
        let colored = |n: &roxmltree::Node<'_, '_>, attr| {
            n.attribute(attr).is_some_and(|c| c.eq_ignore_ascii_case(&color))
        };
        let mut lines = Vec::new();
        let (mut circles, mut bars, mut texts) = (0, 0, Vec::new());
        for n in doc.descendants() {
            match n.tag_name().name() {
                "polyline" if colored(&n, "stroke") => {
                    lines.push(n.attribute("points").unwrap().split_whitespace().count());
                }
                "circle" if colored(&n, "fill") => circles += 1,
                "rect" if colored(&n, "fill") => bars += 1,
                "text" => texts.push(n.text().unwrap_or("").trim().to_string()),
                _ => {}
            }
        }
        (lines, circles, bars, texts)
    }

    #[test]
    fn the_svg_has_a_latency_line_and_size_bars_per_component() {
        let svg = signature_svg("run A", &signature(1), None).unwrap();
        let (lines, circles, bars, texts) = parse(&svg, RUN_COLOR);
        assert_eq!(lines, vec![3; 4], "one line of three sizes per component");
        assert_eq!(circles, 12);
        assert_eq!(bars, 12 + 1, "three bars per component, and the legend's");
        for c in Component::ALL {
            assert!(texts.contains(&format!("{}: mean latency", c.name())), "{texts:?}");
            assert!(texts.contains(&format!("{}: frames per size", c.name())), "{texts:?}");
        }
        assert!(texts.contains(&"run A".to_string()));
        assert!(texts.contains(&"1 KiB".to_string()), "size classes are labelled: {texts:?}");
        assert!(!texts.contains(&"baseline".to_string()));
        assert_eq!(parse(&svg, BASELINE_COLOR).0.len(), 0);
    }

    #[test]
    fn a_baseline_adds_its_own_series_beside_the_runs() {
        let svg = signature_svg("run B", &signature(2), Some(&signature(1))).unwrap();
        let (lines, circles, bars, texts) = parse(&svg, BASELINE_COLOR);
        assert_eq!((lines, circles, bars), (vec![3; 4], 12, 13));
        assert_eq!(parse(&svg, RUN_COLOR).0, vec![3; 4]);
        assert!(texts.contains(&"baseline".to_string()));
    }

    #[test]
    fn an_empty_signature_still_draws_its_panels() {
        let empty = Signature::of(&crate::Report::default(), None);
        let svg = signature_svg("nothing", &empty, None).unwrap();
        let (lines, circles, _, texts) = parse(&svg, RUN_COLOR);
        assert!(lines.iter().all(|&n| n == 0) && circles == 0);
        assert!(texts.contains(&"net: mean latency".to_string()));
    }
}
