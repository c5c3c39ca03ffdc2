//! SVG plots of a set of runs (plotters' SVG backend: text is left to the viewer's fonts,
//! so nothing depends on system fonts at build or run time): online latency CDF, offline JCT
//! CDF, GPU utilization over time, and per-run bars.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::metrics::Report;

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn color(i: usize) -> RGBColor {
    const P: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    P[i % P.len()]
}

/// Writes every plot of `reports` into `dir` (created if missing); returns the files.
pub fn write_all(dir: &Path, reports: &[Report]) -> Res<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files = vec![
        latency_cdf(&dir.join("latency_cdf.svg"), reports)?,
        jct_cdf(&dir.join("jct_cdf.svg"), reports)?,
        utilization(&dir.join("utilization.svg"), reports)?,
        bars(&dir.join("bars.svg"), reports)?,
    ];
    Ok(files)
}

/// CDF lines on a log x axis; `curve(i)` gives run `i`'s (x, F(x)) points.
fn cdf_plot(path: &Path, title: &str, xlabel: &str, reports: &[Report], lo: f64, hi: f64, curve: &dyn Fn(usize) -> Vec<(f64, f64)>) -> Res<PathBuf> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(err)?;
    chart.configure_mesh().x_desc(xlabel).y_desc("fraction").draw().map_err(err)?;
    for (i, r) in reports.iter().enumerate() {
        let pts = curve(i);
        if pts.is_empty() {
            continue;
        }
        line(&mut chart, pts, i, 2, r)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(err)?;
    Ok(path.to_path_buf())
}

/// One run's curve in its colour, with its legend entry.
fn line<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, DB, CT>,
    pts: Vec<(f64, f64)>,
    i: usize,
    width: u32,
    r: &Report,
) -> Res<()> {
    let c = color(i);
    chart
        .draw_series(LineSeries::new(pts, c.stroke_width(width)))
        .map_err(err)?
        .label(r.label())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    Ok(())
}

/// The legend box, at `pos`.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> Res<()> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

fn latency_cdf(path: &Path, reports: &[Report]) -> Res<PathBuf> {
    let hi = reports.iter().map(|r| r.series.latency.quantile(0.999)).fold(1.0, f64::max);
    let lo = reports
        .iter()
        .map(|r| r.series.latency.quantile(0.01))
        .filter(|x| *x > 0.0)
        .fold(hi, f64::min)
        .max(1e-3);
    let grid: Vec<f64> = (0..=200).map(|k| lo * (hi / lo).powf(f64::from(k) / 200.0)).collect();
    cdf_plot(path, "Online request latency (CDF)", "latency, ms (log)", reports, lo, hi, &|i| {
        let h = &reports[i].series.latency;
        grid.iter().map(|&x| (x, h.cdf(x))).collect()
    })
}

fn jct_cdf(path: &Path, reports: &[Report]) -> Res<PathBuf> {
    let all = || reports.iter().flat_map(|r| r.series.jct_s.iter().map(|s| s / 3600.0));
    let lo = all().filter(|x| *x > 0.0).fold(f64::INFINITY, f64::min);
    let hi = all().fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (0.01, 1.0) };
    cdf_plot(path, "Offline job completion time (CDF)", "JCT, hours (log)", reports, lo, hi, &|i| {
        let v = &reports[i].series.jct_s;
        let n = v.len().max(1) as f64;
        // At most ~400 points per curve.
        let step = (v.len() / 400).max(1);
        v.iter().enumerate().filter(|(k, _)| k % step == 0 || *k + 1 == v.len()).map(|(k, s)| (s / 3600.0, (k + 1) as f64 / n)).collect()
    })
}

fn utilization(path: &Path, reports: &[Report]) -> Res<PathBuf> {
    let hours = reports.iter().map(|r| r.series.util_hourly_pct.len()).max().unwrap_or(1).max(1);
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("GPU utilization of online GPUs over time (hourly)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..hours as f64, 0.0..100.0)
        .map_err(err)?;
    chart.configure_mesh().x_desc("simulated hour").y_desc("GPU util %").draw().map_err(err)?;
    for (i, r) in reports.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r.series.util_hourly_pct.iter().enumerate().map(|(h, u)| (h as f64 + 0.5, *u)).collect();
        line(&mut chart, pts, i, 1, r)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(err)?;
    Ok(path.to_path_buf())
}

/// Four panels of one bar per run: JCT (h), oversold GPU, online p99 / alone, SLO violations.
fn bars(path: &Path, reports: &[Report]) -> Res<PathBuf> {
    let root = SVGBackend::new(path, (1100, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (header, body) = root.split_vertically(16 + 14 * (reports.len() as u32).div_ceil(4));
    let panels = body.split_evenly((2, 2));
    type Metric = (&'static str, fn(&Report) -> f64);
    let metrics: [Metric; 4] = [
        ("offline avg JCT (h)", |r| r.offline_avg_jct_s / 3600.0),
        ("oversold GPU (MuxFlow eq. 3)", |r| r.oversold_gpu),
        ("online p99 latency / alone", |r| r.online_p99_norm),
        ("SLO violations (% of requests)", |r| r.slo_violation_pct),
    ];
    let n = reports.len().max(1);
    for (area, (title, f)) in panels.iter().zip(metrics) {
        let top = reports.iter().map(f).fold(0.0, f64::max).max(1e-9) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| format!("{}", x.floor() as i64 + 1))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(reports.iter().enumerate().map(|(i, r)| {
                Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, f(r))], color(i).filled())
            }))
            .map_err(err)?;
    }
    // Legend: run number -> label, above the panels.
    let legend: Vec<String> = reports.iter().enumerate().map(|(i, r)| format!("{}: {}", i + 1, r.label())).collect();
    for (i, l) in legend.iter().enumerate() {
        header
            .draw(&Text::new(l.clone(), (20 + 270 * (i as i32 % 4), 4 + 14 * (i as i32 / 4)), ("sans-serif", 12).into_font().color(&color(i))))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plots of an empty and a trivial run are written without fonts or panics.
    #[test]
    fn writes_svg_files() {
        let dir = std::env::temp_dir().join(format!("sim-plots-{}", std::process::id()));
        let files = write_all(&dir, &[]).unwrap();
        assert_eq!(files.len(), 4);
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.starts_with("<svg"), "{}", f.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
