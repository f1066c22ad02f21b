//! Bar charts as SVG, written by hand: three panels of grouped bars are a few dozen lines, and a
//! plotting crate would double the build for them.

use std::fmt::Write;

/// One panel: a value per (group, series).
pub struct Panel<'a> {
    pub title: &'a str,
    pub groups: Vec<String>,
    /// (series name, colour, one value per group)
    pub series: Vec<(&'a str, &'a str, Vec<f64>)>,
}

const PANEL_WIDTH: f64 = 360.0;
const PANEL_HEIGHT: f64 = 260.0;
const MARGIN: f64 = 40.0;

/// Renders panels side by side, with a legend.
pub fn render(title: &str, panels: &[Panel<'_>]) -> String {
    let width = PANEL_WIDTH * panels.len() as f64 + MARGIN;
    let height = PANEL_HEIGHT + 90.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{MARGIN}" y="20" font-size="14">{title}</text>"#
    );
    for (at, panel) in panels.iter().enumerate() {
        draw_panel(&mut svg, panel, MARGIN + at as f64 * PANEL_WIDTH, 40.0);
    }
    if let Some(first) = panels.first() {
        for (at, (name, colour, _)) in first.series.iter().enumerate() {
            let x = MARGIN + at as f64 * 140.0;
            let y = height - 15.0;
            let _ = write!(svg, r#"<rect x="{x}" y="{}" width="12" height="12" fill="{colour}"/>"#, y - 10.0);
            let _ = write!(svg, r#"<text x="{}" y="{y}">{name}</text>"#, x + 16.0);
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(svg: &mut String, panel: &Panel<'_>, left: f64, top: f64) {
    let plot_width = PANEL_WIDTH - 70.0;
    let plot_height = PANEL_HEIGHT - 60.0;
    let (x0, y0) = (left + 40.0, top + 20.0 + plot_height);
    // Headroom above the tallest bar for its label.
    let max =
        panel.series.iter().flat_map(|(_, _, values)| values.iter().copied()).fold(0.0_f64, f64::max).max(1e-9) * 1.12;
    let _ = write!(svg, r#"<text x="{}" y="{}" font-size="12">{}</text>"#, left + 40.0, top + 10.0, panel.title);
    let _ = write!(svg, r#"<line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}" stroke="black"/>"#, x0 + plot_width);
    let _ = write!(svg, r#"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{}" stroke="black"/>"#, y0 - plot_height);
    let group_width = plot_width / panel.groups.len().max(1) as f64;
    let bar_width = group_width * 0.8 / panel.series.len().max(1) as f64;
    for (g, group) in panel.groups.iter().enumerate() {
        let group_left = x0 + g as f64 * group_width + group_width * 0.1;
        for (s, (_, colour, values)) in panel.series.iter().enumerate() {
            let value = values.get(g).copied().unwrap_or(0.0);
            let bar_height = plot_height * value / max;
            let x = group_left + s as f64 * bar_width;
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bar_height:.1}" fill="{colour}"/>"#,
                y0 - bar_height,
                bar_width * 0.95
            );
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                x + bar_width / 2.0,
                y0 - bar_height - 3.0,
                short(value)
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{group}</text>"#,
            group_left + group_width * 0.4,
            y0 + 14.0
        );
    }
}

fn short(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}
