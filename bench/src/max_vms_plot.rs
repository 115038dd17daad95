//! The `--max-vms` plot: each SLO figure against the VM count, one line per mode over its
//! search's steps, the bound as a dashed line, each mode's maximum ringed.
//!
//! ```text
//!   +-- Guest timer lateness p99 --+  +-- Host CPU busy --------------+
//!   | ms        - - - - bound - -  |  | % of the host's CPUs  - bound |
//!   |   o--o--o---(O)--x           |  |   o--o--(O)--x                |
//!   +-- VMs (linear) --------------+  +-------------------------------+
//! ```

use plotters::prelude::*;

use super::error::PlotError;
use super::max_vms_report::MaxVmsReport;
use super::plot::{draw_legend, nice_ceiling, COLORS};
use super::slo::Verdict;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 400;

fn err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError(e.to_string())
}

/// The bounds drawn, one panel each: (bound, title, y label).
const PANELS: [(&str, &str, &str); 2] = [
    ("lateness_p99", "Guest timer lateness p99", "ms"),
    ("host_busy", "Host CPU busy", "% of the host's CPUs"),
];

fn verdict<'a>(verdicts: &'a [Verdict], bound: &str) -> Option<&'a Verdict> {
    verdicts.iter().find(|v| v.bound == bound)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &MaxVmsReport,
    (bound, title, y_label): (&str, &str, &str),
    legend: bool,
) -> Result<(), PlotError> {
    let steps = report.modes.iter().flat_map(|m| &m.steps);
    let xmax = steps.clone().map(|s| s.vms).max().unwrap_or(1).max(1);
    let limit = steps
        .clone()
        .find_map(|s| verdict(&s.verdicts, bound))
        .map_or(0.0, |v| v.limit);
    let ymax = steps
        .filter_map(|s| verdict(&s.verdicts, bound)?.figure)
        .fold(limit, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u32..xmax + 1, 0f64..nice_ceiling(ymax * 1.1))
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(1)
        .x_desc("VMs")
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    chart
        .draw_series(DashedLineSeries::new(
            [(0, limit), (xmax + 1, limit)],
            6,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))
        .map_err(err)?;
    for (i, m) in report.modes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut points: Vec<(u32, f64)> = m
            .steps
            .iter()
            .filter_map(|s| Some((s.vms, verdict(&s.verdicts, bound)?.figure?)))
            .collect();
        points.sort_by_key(|p| p.0);
        let series = chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(err)?;
        if legend {
            series.label(m.mode.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        }
        chart
            .draw_series(points.iter().map(|&pt| Circle::new(pt, 3, color.filled())))
            .map_err(err)?;
        // The maximum within the SLO, ringed.
        let best = points.iter().find(|p| p.0 == m.max_vms).copied();
        chart
            .draw_series(best.map(|pt| Circle::new(pt, 8, color.stroke_width(2))))
            .map_err(err)?;
    }
    if legend {
        draw_legend(&mut chart)?;
    }
    Ok(())
}

/// The SVG document of a `--max-vms` report.
pub fn svg(report: &MaxVmsReport) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        for (i, (area, p)) in root.split_evenly((1, 2)).iter().zip(PANELS).enumerate() {
            draw_panel(area, report, p, i == 0)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}
