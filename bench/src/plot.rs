//! The density plot: host CPU and host wake-ups per vCPU against the number of VMs, one line
//! per mode, drawn by plotters' SVG backend into a self-contained SVG document; with power
//! readings (schema 2), a third panel: host power per VM above the no-VM baseline, or host
//! idle exits per vCPU where no energy was read.
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
/// The modes' colours, in order.
pub(crate) const COLORS: &[RGBColor] = &[
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
    value: fn(&DensityRow) -> Option<f64>,
}

const PANELS: [Panel; 2] = [
    Panel {
        title: "Host CPU per vCPU",
        y_label: "% of one host core",
        value: |r| Some(r.host_cpu_percent_per_vcpu),
    },
    Panel {
        title: "Host wake-ups per vCPU",
        y_label: "voluntary context switches / s",
        value: |r| Some(r.host_wakeups_per_vcpu_s),
    },
];

/// The third panel where energy was read: per-VM power above the no-VM baseline.
const POWER_PANEL: Panel = Panel {
    title: "Host power per VM",
    y_label: "W above the no-VM baseline",
    value: |r| r.power.as_ref()?.watts_per_vm.value,
};

/// The third panel where energy was not read: host idle exits per vCPU.
const EXITS_PANEL: Panel = Panel {
    title: "Host idle exits per vCPU",
    y_label: "exits / s above the no-VM baseline",
    value: |r| r.power.as_ref()?.idle_exits_per_vcpu_s.value,
};

/// The panels of `report`: host CPU, wake-ups, and power (or idle exits) if it has them.
fn panels(report: &DensityReport) -> Vec<&'static Panel> {
    let mut v: Vec<&Panel> = PANELS.iter().collect();
    let has = |p: &Panel| report.results.iter().any(|r| (p.value)(r).is_some());
    if has(&POWER_PANEL) {
        v.push(&POWER_PANEL);
    } else if has(&EXITS_PANEL) {
        v.push(&EXITS_PANEL);
    }
    v
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `max`.
pub(crate) fn nice_ceiling(max: f64) -> f64 {
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
    let values = || report.results.iter().filter_map(p.value);
    let ymax = nice_ceiling(values().fold(0.0f64, f64::max));
    // Figures above a baseline may fall below it.
    let low = values().fold(0.0f64, f64::min);
    let ymin = if low < 0.0 { -nice_ceiling(-low) } else { 0.0 };
    // The x axis is categorical over the VM counts: one segment per count, spread evenly.
    let count = i32::try_from(xs.len()).map_err(err)?;
    let label = |i: &i32| usize::try_from(*i).ok().and_then(|i| xs.get(i));
    let mut chart = ChartBuilder::on(area)
        .caption(p.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        // A segmented range holds both of its ends: one empty segment pads each side.
        .build_cartesian_2d((-1..count).into_segmented(), ymin..ymax)
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
                Some((SegmentValue::CenterOf(x), (p.value)(r)?))
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
        draw_legend(&mut chart)?;
    }
    Ok(())
}

/// Draws the legend of `chart`'s labelled series in its upper left corner.
pub(crate) fn draw_legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>) -> Result<(), PlotError>
where
    DB: DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(err)
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
        let panels = panels(report);
        let areas = charts.split_evenly((1, panels.len()));
        for (i, (area, p)) in areas.iter().zip(panels).enumerate() {
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
    fn a_third_panel_shows_power_or_else_idle_exits() {
        use crate::density_power::row_power;
        use crate::power::{PowerError, PowerWindow, Reading};
        let w = |exits: f64| {
            Reading::ok(PowerWindow {
                seconds: 1.0,
                energy: Reading::missing("no RAPL"),
                idle: Reading::missing("no cpuidle"),
                idle_exits_per_s: Reading::ok(exits),
                local_timer_irqs_per_s: Reading::missing("-"),
                resched_irqs_per_s: Reading::missing("-"),
                call_irqs_per_s: Reading::missing("-"),
                processes: Vec::new(),
                context_switches_per_s: Reading::missing(PowerError::NoProcesses),
                meter: Reading::missing(PowerError::NoMeter),
            })
        };
        let mut rows = vec![density_row("kernel", 1, 0.25), density_row("pull", 1, 0.5)];
        for r in &mut rows {
            r.power = Some(row_power(r, w(100.0), &w(20.0)));
        }
        let svg = density_svg(&density_report(rows)).unwrap();
        assert!(svg.contains("Host idle exits per vCPU"), "{svg}");
        assert!(!svg.contains("Host power per VM"));
        assert_eq!(svg.matches("<circle").count(), 2 * 3);
    }

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
