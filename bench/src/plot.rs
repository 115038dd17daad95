//! The density plot: host CPU and host wake-ups per vCPU against the number of VMs, one line
//! per mode, as a self-contained SVG (no plotting dependency).

use std::fmt::Write as _;

use super::report::{DensityReport, DensityRow};

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 280.0;
const MARGIN_L: f64 = 60.0;
const MARGIN_T: f64 = 40.0;
const MARGIN_B: f64 = 50.0;
const GAP: f64 = 80.0;
const LEGEND_W: f64 = 120.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf",
];

struct Panel<'a> {
    title: &'a str,
    y_label: &'a str,
    value: fn(&DensityRow) -> f64,
    left: f64,
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `max`.
fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let mut step = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * step >= max {
            step *= m;
            return step;
        }
    }
    step * 10.0
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn panel(svg: &mut String, p: &Panel, report: &DensityReport, modes: &[String], xs: &[u32]) {
    let (x0, y0) = (p.left + MARGIN_L, MARGIN_T);
    let ymax = nice_ceiling(report.results.iter().map(p.value).fold(0.0f64, f64::max));
    // The x axis is categorical over the VM counts (1, 8, 32, 64 spread evenly).
    let xpos = |n: u32| {
        let i = xs.iter().position(|&x| x == n).unwrap_or(0);
        if xs.len() <= 1 {
            x0 + PANEL_W / 2.0
        } else {
            x0 + PANEL_W * i as f64 / (xs.len() - 1) as f64
        }
    };
    let ypos = |v: f64| y0 + PANEL_H - PANEL_H * (v / ymax).clamp(0.0, 1.0);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" text-anchor="middle">{}</text>"#,
        x0 + PANEL_W / 2.0,
        y0 - 15.0,
        escape(p.title)
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{x0:.1}" y="{y0:.1}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#888"/>"##
    );
    for k in 0..=5 {
        let v = ymax * f64::from(k) / 5.0;
        let y = ypos(v);
        let _ = writeln!(
            svg,
            "<line x1=\"{x0:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
            x0 + PANEL_W,
            x0 - 6.0,
            y + 4.0,
            format_tick(v)
        );
    }
    for &n in xs {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{n}</text>"#,
            xpos(n),
            y0 + PANEL_H + 16.0
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">VMs</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" \
         transform=\"rotate(-90 {:.1} {:.1})\">{}</text>",
        x0 + PANEL_W / 2.0,
        y0 + PANEL_H + 36.0,
        p.left + 14.0,
        y0 + PANEL_H / 2.0,
        p.left + 14.0,
        y0 + PANEL_H / 2.0,
        escape(p.y_label)
    );
    for (i, mode) in modes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> = report
            .results
            .iter()
            .filter(|r| &r.mode == mode)
            .map(|r| (xpos(r.vms), ypos((p.value)(r))))
            .collect();
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for (x, y) in points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"/>"#
            );
        }
    }
}

fn format_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The SVG document for a density report.
pub fn density_svg(report: &DensityReport) -> String {
    let mut modes: Vec<String> = Vec::new();
    let mut xs: Vec<u32> = Vec::new();
    for r in &report.results {
        if !modes.contains(&r.mode) {
            modes.push(r.mode.clone());
        }
        if !xs.contains(&r.vms) {
            xs.push(r.vms);
        }
    }
    xs.sort_unstable();
    let width = 2.0 * (MARGIN_L + PANEL_W) + GAP + LEGEND_W;
    let height = MARGIN_T + PANEL_H + MARGIN_B + 20.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let panels = [
        Panel {
            title: "Host CPU per vCPU",
            y_label: "% of one host core",
            value: |r| r.host_cpu_percent_per_vcpu,
            left: 0.0,
        },
        Panel {
            title: "Host wake-ups per vCPU",
            y_label: "voluntary context switches / s",
            value: |r| r.host_wakeups_per_vcpu_s,
            left: MARGIN_L + PANEL_W + GAP,
        },
    ];
    for p in &panels {
        panel(&mut svg, p, report, &modes, &xs);
    }
    let lx = 2.0 * (MARGIN_L + PANEL_W) + GAP + 10.0;
    for (i, mode) in modes.iter().enumerate() {
        let y = MARGIN_T + 20.0 * i as f64 + 10.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{lx:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{}\" \
             stroke-width=\"3\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>",
            lx + 20.0,
            COLORS[i % COLORS.len()],
            lx + 26.0,
            y + 4.0,
            escape(mode)
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="10" y="{:.1}" font-size="11" fill="#555">{} vCPU(s) per VM, {:.0} s per run, guest {}</text>"##,
        height - 8.0,
        report.params.cpus_per_vm,
        report.params.duration_s,
        escape(&report.params.guest_cmdline)
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ceilings_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(0.7), 1.0);
        assert_eq!(nice_ceiling(1.3), 2.0);
        assert_eq!(nice_ceiling(31.0), 50.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b & c>"), "a&lt;b &amp; c&gt;");
    }
}
