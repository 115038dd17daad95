//! The density plot: host CPU and host wake-ups per vCPU against the number of VMs, one line
//! per mode, drawn by plotters' SVG backend into a self-contained SVG document.
//!
//! ```text
//!   +-- Host CPU per vCPU --+  +-- Host wake-ups per vCPU --+
//!   | % of one host core    |  | voluntary ctxt switches/s  |  legend: one colour per mode
//!   |   x: VM counts, spread evenly (1, 8, 32, 64)           |
//!   +-----------------------+  +----------------------------+
//!   footer: vCPUs per VM, seconds per run, guest command line
//! ```

use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue};
use plotters::prelude::*;

use super::error::PlotError;
use super::report::{DensityReport, DensityRow};

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 400;
const FOOTER: u32 = 24;
const COLORS: &[RGBColor] = &[
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x17, 0xbe, 0xcf),
];

struct Panel {
    title: &'static str,
    y_label: &'static str,
    value: fn(&DensityRow) -> f64,
}

const PANELS: [Panel; 2] = [
    Panel {
        title: "Host CPU per vCPU",
        y_label: "% of one host core",
        value: |r| r.host_cpu_percent_per_vcpu,
    },
    Panel {
        title: "Host wake-ups per vCPU",
        y_label: "voluntary context switches / s",
        value: |r| r.host_wakeups_per_vcpu_s,
    },
];

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `max`.
fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let step = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * step)
        .find(|&c| c >= max)
        .unwrap_or(step * 10.0)
}

fn err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError(e.to_string())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    p: &Panel,
    report: &DensityReport,
    modes: &[String],
    xs: &[u32],
    legend: bool,
) -> Result<(), PlotError> {
    let ymax = nice_ceiling(report.results.iter().map(p.value).fold(0.0f64, f64::max));
    // The x axis is categorical over the VM counts: one segment per count, spread evenly.
    let count = i32::try_from(xs.len()).map_err(err)?;
    let label = |i: &i32| usize::try_from(*i).ok().and_then(|i| xs.get(i));
    let mut chart = ChartBuilder::on(area)
        .caption(p.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        // A segmented range holds both of its ends: one empty segment pads each side.
        .build_cartesian_2d((-1..count).into_segmented(), 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(1)
        .x_desc("VMs")
        .y_desc(p.y_label)
        .x_labels(xs.len() + 2)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => label(i).map_or(String::new(), u32::to_string),
            _ => String::new(),
        })
        .draw()
        .map_err(err)?;
    for (i, mode) in modes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(SegmentValue<i32>, f64)> = report
            .results
            .iter()
            .filter(|r| &r.series() == mode)
            .filter_map(|r| {
                let x = i32::try_from(xs.iter().position(|&n| n == r.vms)?).ok()?;
                Some((SegmentValue::CenterOf(x), (p.value)(r)))
            })
            .collect();
        let series = chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(err)?;
        if legend {
            series.label(mode.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        }
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|pt| Circle::new(pt, 3, color.filled())),
            )
            .map_err(err)?;
    }
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// The SVG document for a density report.
pub fn density_svg(report: &DensityReport) -> Result<String, PlotError> {
    let mut modes: Vec<String> = Vec::new();
    let mut xs: Vec<u32> = Vec::new();
    for r in &report.results {
        if !modes.contains(&r.series()) {
            modes.push(r.series());
        }
        if !xs.contains(&r.vms) {
            xs.push(r.vms);
        }
    }
    xs.sort_unstable();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (charts, footer) = root.split_vertically(HEIGHT - FOOTER);
        for (i, (area, p)) in charts.split_evenly((1, 2)).iter().zip(&PANELS).enumerate() {
            draw_panel(area, p, report, &modes, &xs, i == 0)?;
        }
        let note = format!(
            "{} vCPU(s) per VM, {:.0} s per run, guest {}",
            report.params.cpus_per_vm, report.params.duration_s, report.params.guest_cmdline
        );
        footer
            .draw_text(
                &note,
                &("sans-serif", 11)
                    .into_font()
                    .color(&RGBColor(0x55, 0x55, 0x55)),
                (10, 4),
            )
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{density_report, density_row};

    #[test]
    fn axis_ceilings_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(0.7), 1.0);
        assert_eq!(nice_ceiling(1.3), 2.0);
        assert_eq!(nice_ceiling(31.0), 50.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
    }

    #[test]
    fn every_mode_and_count_is_drawn() {
        let report = density_report(vec![
            density_row("kernel", 1, 0.25),
            density_row("kernel", 8, 0.5),
            density_row("pull&push", 1, 0.75),
            density_row("pull&push", 8, 31.0),
        ]);
        let svg = density_svg(&report).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>')?.1.split_once("</text>"))
            .map(|(text, _)| text.trim())
            .collect();
        for want in [
            "Host CPU per vCPU",
            "Host wake-ups per vCPU",
            "kernel",
            "pull&amp;push",
            "1",
            "8",
            "50.0",
        ] {
            assert!(texts.contains(&want), "no text {want:?} in {texts:?}");
        }
        // One line per mode and panel, one legend mark per mode, one dot per row and panel.
        assert_eq!(svg.matches(r#"stroke-width="2""#).count(), 2 * 2);
        assert_eq!(svg.matches(r#"stroke-width="3""#).count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4 * 2);
    }
}
