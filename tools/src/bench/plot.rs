//! `--plot FILE.svg`: a report's bandwidth against message size and its latency CDFs, as
//! one SVG (plotters, SVG backend only).
//!
//! * **Bandwidth**: every `bandwidth` row in Gbit/s with a message size, one line per
//!   (test, name) over the sizes (log scale); a ceiling row without a size (the AF_XDP
//!   ceiling moves MTU-sized frames whatever the application's message size) is drawn as a
//!   flat line across them.
//! * **Latency CDF**: every row with a sample distribution, fraction of samples against
//!   latency (log scale), one line per row.
//!
//! Series are named as in the table (`name`, or `test name` when the rows span several
//! tests); kernel rows are drawn in greys, ceiling rows in green, xwarp rows in colours.

use std::collections::BTreeMap;

use plotters::prelude::*;

use std::path::Path;

use super::report::{write_out, Report, Row, Side, Unit};

/// Width of the picture.
const WIDTH: u32 = 960;
/// Height of each chart.
const CHART_HEIGHT: u32 = 480;

/// A named series of points.
struct Series {
    label: String,
    side: Side,
    points: Vec<(f64, f64)>,
}

fn label(r: &Row, many_tests: bool) -> String {
    if many_tests {
        format!("{} {}", r.test, r.name)
    } else {
        r.name.clone()
    }
}

/// The bandwidth-against-size series and the flat ceiling lines.
fn bandwidth_series(rep: &Report) -> (Vec<Series>, Vec<Series>) {
    let bw: Vec<&Row> = rep
        .rows
        .iter()
        .filter(|r| r.metric == "bandwidth" && r.unit == Unit::Gbps)
        .collect();
    let many = bw.iter().any(|r| r.test != bw[0].test);
    let mut sized: BTreeMap<(String, String), Series> = BTreeMap::new();
    let mut flat = Vec::new();
    for r in &bw {
        match r.size {
            Some(s) => sized
                .entry((r.test.clone(), r.name.clone()))
                .or_insert_with(|| Series {
                    label: label(r, many),
                    side: r.side,
                    points: Vec::new(),
                })
                .points
                .push((s as f64, r.value)),
            None if r.side == Side::Ceiling => flat.push(Series {
                label: label(r, many),
                side: r.side,
                points: vec![(0.0, r.value)],
            }),
            None => {}
        }
    }
    let mut sized: Vec<Series> = sized.into_values().collect();
    for s in &mut sized {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    // Kernel first, then xwarp, then the ceiling: the legend reads baseline first.
    sized.sort_by_key(|s| side_order(s.side));
    (sized, flat)
}

fn side_order(s: Side) -> u8 {
    match s {
        Side::Kernel => 0,
        Side::Xwarp => 1,
        Side::Ceiling => 2,
    }
}

/// The latency CDF series (µs), one per row with a distribution.
fn cdf_series(rep: &Report) -> Vec<Series> {
    let rows: Vec<&Row> = rep
        .rows
        .iter()
        .filter(|r| r.dist.as_ref().is_some_and(|d| !d.cdf.is_empty()))
        .collect();
    let many = rows.iter().any(|r| r.test != rows[0].test);
    let mut out: Vec<Series> = rows
        .iter()
        .map(|r| Series {
            label: label(r, many) + &format!(" ({})", r.unit.name()),
            side: r.side,
            points: r
                .dist
                .iter()
                .flat_map(|d| d.cdf.iter().map(|p| (p[0].max(1e-3), p[1])))
                .collect(),
        })
        .collect();
    out.sort_by_key(|s| side_order(s.side));
    out
}

/// Colour of the `i`-th series of its side.
fn colour(side: Side, i: usize) -> RGBColor {
    const KERNEL: [RGBColor; 3] = [
        RGBColor(0, 0, 0),
        RGBColor(110, 110, 110),
        RGBColor(170, 170, 170),
    ];
    const XWARP: [RGBColor; 5] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(23, 190, 207),
    ];
    const CEILING: [RGBColor; 2] = [RGBColor(44, 160, 44), RGBColor(120, 200, 120)];
    match side {
        Side::Kernel => KERNEL[i % KERNEL.len()],
        Side::Xwarp => XWARP[i % XWARP.len()],
        Side::Ceiling => CEILING[i % CEILING.len()],
    }
}

fn colours(series: &[Series]) -> Vec<RGBColor> {
    let mut n: BTreeMap<u8, usize> = BTreeMap::new();
    series
        .iter()
        .map(|s| {
            let k = n.entry(side_order(s.side)).or_default();
            *k += 1;
            colour(s.side, *k - 1)
        })
        .collect()
}

fn size_label(v: f64) -> String {
    let b = v.round() as u64;
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        b.to_string()
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn e2s<E: std::fmt::Debug>(e: E) -> String {
    format!("plot: {e:?}")
}

fn draw_bandwidth(
    area: &Area<'_>,
    rep: &Report,
    sized: &[Series],
    flat: &[Series],
) -> Result<(), String> {
    let xs = sized.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::INFINITY, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    // Ticks at the sizes measured.
    let mut keys: Vec<f64> = sized
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    keys.sort_by(f64::total_cmp);
    keys.dedup();
    // A single size still gets a visible range.
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo / 2.0, hi * 2.0)
    };
    let ymax = sized
        .iter()
        .chain(flat)
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0f64, f64::max)
        .max(1e-3)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("xwarp bench {}: bandwidth against message size", rep.bench),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale().with_key_points(keys), 0f64..ymax)
        .map_err(e2s)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("Gbit/s")
        .x_label_formatter(&|v| size_label(*v))
        .draw()
        .map_err(e2s)?;
    // The flat lines span the sizes drawn.
    let flat_lines = flat.iter().map(|s| Series {
        label: s.label.clone() + " (MTU frames)",
        side: s.side,
        points: vec![(lo, s.points[0].1), (hi, s.points[0].1)],
    });
    let owned: Vec<Series> = sized
        .iter()
        .map(|s| Series {
            label: s.label.clone(),
            side: s.side,
            points: s.points.clone(),
        })
        .chain(flat_lines)
        .collect();
    let cols = colours(&owned);
    for (s, c) in owned.iter().zip(cols) {
        let style = ShapeStyle::from(&c).stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(e2s)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(s.points.iter().map(|p| Circle::new(*p, 3, c.filled())))
            .map_err(e2s)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e2s)
}

fn draw_cdf(area: &Area<'_>, rep: &Report, series: &[Series]) -> Result<(), String> {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::INFINITY, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = if hi > lo * 1.01 {
        (lo * 0.9, hi * 1.1)
    } else {
        (lo / 2.0, hi * 2.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("xwarp bench {}: latency CDF", rep.bench),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)
        .map_err(e2s)?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, one-way: half the round trip)")
        .y_desc("fraction of samples")
        .draw()
        .map_err(e2s)?;
    for (s, c) in series.iter().zip(colours(series)) {
        let style = ShapeStyle::from(&c).stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(e2s)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e2s)
}

/// The SVG of `rep`'s plots: the bandwidth chart, the latency CDF chart, or both one above
/// the other. An error when the report has neither sized bandwidth rows nor distributions.
pub fn svg(rep: &Report) -> Result<String, String> {
    let (sized, flat) = bandwidth_series(rep);
    let cdf = cdf_series(rep);
    let charts = usize::from(!sized.is_empty()) + usize::from(!cdf.is_empty());
    if charts == 0 {
        return Err(format!(
            "--plot: nothing to plot in the {} report (no bandwidth rows with a message size, no latency distributions)",
            rep.bench
        ));
    }
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, CHART_HEIGHT * charts as u32))
            .into_drawing_area();
        root.fill(&WHITE).map_err(e2s)?;
        let areas = root.split_evenly((charts, 1));
        let mut next = areas.iter();
        if !sized.is_empty() {
            draw_bandwidth(next.next().ok_or("plot: no area")?, rep, &sized, &flat)?;
        }
        if !cdf.is_empty() {
            draw_cdf(next.next().ok_or("plot: no area")?, rep, &cdf)?;
        }
        root.present().map_err(e2s)?;
    }
    Ok(out)
}

/// Write the report's JSON and plot where the options ask (`None`: not asked).
pub fn write_outputs(r: &Report, json: Option<&Path>, plot: Option<&Path>) -> Result<(), String> {
    if let Some(p) = json {
        r.write_json(p).map_err(|e| e.to_string())?;
    }
    if let Some(p) = plot {
        let svg = svg(r)?;
        write_out(p, svg.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels_use_binary_suffixes() {
        assert_eq!(size_label(65536.0), "64K");
        assert_eq!(size_label(1048576.0), "1M");
        assert_eq!(size_label(1000.0), "1000");
    }

    #[test]
    fn a_report_without_plottable_rows_is_an_error() {
        let mut r = Report::new("shim");
        r.push(Row::new(
            "redis",
            "shim",
            Side::Xwarp,
            "rate",
            Unit::PerSec,
            1.0,
        ));
        assert!(svg(&r).unwrap_err().contains("nothing to plot"));
    }
}
