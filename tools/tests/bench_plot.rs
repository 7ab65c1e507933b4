//! `--plot`: an SVG rendered from a small bench report is well-formed XML (parsed by
//! roxmltree), names every series in its legend, and draws one polyline per series; a
//! report with nothing to plot is a clear error.

use xwarp_tools::bench::plot;
use xwarp_tools::bench::report::{Dist, Report, Row, Side, Unit};

/// A report with a bandwidth sweep (kernel, two xwarp tests, a size-less ceiling) and two
/// latency distributions.
fn small_report() -> Report {
    let mut r = Report::new("rdma");
    for (i, size) in [4096usize, 65536, 1 << 20].into_iter().enumerate() {
        let g = 1.0 + i as f64;
        r.push(Row::new("bulk", "tcp", Side::Kernel, "bandwidth", Unit::Gbps, g).size(size));
        r.push(
            Row::new(
                "bulk",
                "write_bw",
                Side::Xwarp,
                "bandwidth",
                Unit::Gbps,
                g * 1.5,
            )
            .size(size),
        );
        r.push(
            Row::new(
                "bulk",
                "read_bw",
                Side::Xwarp,
                "bandwidth",
                Unit::Gbps,
                g * 1.2,
            )
            .size(size),
        );
    }
    r.push(Row::new(
        "bulk",
        "afxdp-ceiling",
        Side::Ceiling,
        "bandwidth",
        Unit::Gbps,
        9.0,
    ));
    let lat =
        |base: f64| Dist::from_samples((0..500).map(|i| base + (i % 50) as f64 * 0.3).collect());
    r.push(
        Row::new(
            "pingpong",
            "write_lat",
            Side::Xwarp,
            "latency_p50",
            Unit::Us,
            8.0,
        )
        .size(64)
        .dist(lat(6.0)),
    );
    r.push(
        Row::new(
            "pingpong",
            "tcp",
            Side::Kernel,
            "latency_p50",
            Unit::Us,
            20.0,
        )
        .size(64)
        .dist(lat(15.0)),
    );
    r.fill_ratios();
    r
}

#[test]
fn plot_is_well_formed_svg_with_every_series_named() {
    let rep = small_report();
    let svg = plot::svg(&rep).expect("render");
    if let Ok(dir) = std::env::var("BENCH_PLOT_OUT") {
        std::fs::write(format!("{dir}/bench_plot.svg"), &svg).unwrap();
    }
    let doc = roxmltree::Document::parse(&svg).expect("the plot is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect();
    for name in [
        "tcp",
        "write_bw",
        "read_bw",
        "afxdp-ceiling (MTU frames)",
        "write_lat (us)",
        "tcp (us)",
        "xwarp bench rdma: bandwidth against message size",
        "xwarp bench rdma: latency CDF",
        "message size (bytes)",
    ] {
        assert!(texts.iter().any(|t| t == name), "no {name:?} in {texts:?}");
    }
    // The size ticks are the sizes measured.
    for tick in ["4K", "64K", "1M"] {
        assert!(
            texts.iter().any(|t| t == tick),
            "no tick {tick} in {texts:?}"
        );
    }
    // One line per series (3 sized + 1 ceiling + 2 CDFs) plus the six legend samples.
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    assert!(lines >= 12, "{lines} polylines");
}

#[test]
fn a_report_with_nothing_to_plot_says_so() {
    let mut rep = Report::new("shim");
    rep.push(Row::new(
        "redis SET -c 50",
        "shim",
        Side::Xwarp,
        "rate",
        Unit::PerSec,
        1e5,
    ));
    let e = plot::svg(&rep).unwrap_err();
    assert!(e.contains("nothing to plot"), "{e}");
}
