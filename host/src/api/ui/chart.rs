//! Line charts of a target's last hour as SVG, one point a minute, drawn by plotters.

use plotters::prelude::*;

use crate::telemetry::activity::MINUTES;

const WIDTH: u32 = 340;
const HEIGHT: u32 = 170;

/// One line of a chart: its name (the legend), colour and points (minutes before now, value).
pub struct Line<'a> {
    pub name: &'a str,
    pub colour: RGBColor,
    pub points: Vec<(i32, f64)>,
}

pub const BLUE_LINE: RGBColor = RGBColor(31, 99, 180);
pub const ORANGE_LINE: RGBColor = RGBColor(214, 110, 20);
pub const RED_LINE: RGBColor = RGBColor(179, 38, 30);

/// The chart's SVG markup, or `None` where plotters could not draw it.
pub fn svg(lines: &[Line<'_>], unit: &str) -> Option<String> {
    let mut markup = String::new();
    draw(&mut markup, lines, unit).ok()?;
    Some(markup)
}

fn draw(
    markup: &mut String,
    lines: &[Line<'_>],
    unit: &str,
) -> Result<(), DrawingAreaErrorKind<<SVGBackend<'static> as DrawingBackend>::ErrorType>> {
    let highest = lines.iter().flat_map(|line| line.points.iter().map(|&(_, y)| y)).fold(0.0, f64::max);
    let top = if highest > 0.0 { highest * 1.15 } else { 1.0 };
    let root = SVGBackend::with_string(markup, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let first = -(MINUTES as i32 - 1);
    let mut chart = ChartBuilder::on(&root)
        .margin(6)
        .x_label_area_size(22)
        .y_label_area_size(44)
        .build_cartesian_2d(first..1, 0.0..top)?;
    chart
        .configure_mesh()
        .x_labels(7)
        .y_labels(5)
        .x_label_formatter(&|minute| format!("{minute}m"))
        .y_desc(unit)
        .light_line_style(WHITE)
        .label_style(("sans-serif", 11))
        .draw()?;
    for line in lines {
        let colour = line.colour;
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), colour.stroke_width(2)))?
            .label(line.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], colour.stroke_width(2)));
        // A point per minute, so that a single minute of traffic shows.
        chart.draw_series(line.points.iter().map(|&point| Circle::new(point, 2, colour.filled())))?;
    }
    if lines.len() > 1 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .label_font(("sans-serif", 11))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
