//! What the benchmark writes besides the table: `--json` (every row and
//! the ceiling) and `--plot` (busbw against size, an SVG).

use plotters::prelude::*;

use super::args::Args;
use super::ceiling::Ceiling;
use super::{Row, Timing};

fn timing(t: &Timing) -> serde_json::Value {
    serde_json::json!({
        "time_us": finite(t.us),
        "algbw_gbps": finite(t.algbw),
        "busbw_gbps": finite(t.busbw),
        "wrong": t.wrong,
        "batches": {
            "iqr": finite(t.spread.iqr),
            "min_us": finite(t.spread.min_us),
            "median_us": finite(t.spread.median_us),
            "max_us": finite(t.spread.max_us),
        },
    })
}

/// JSON has no NaN or infinity: those become null.
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// What the time split measured: the collective's size and each rank's
/// split per collective.
pub struct Split<'a> {
    pub bytes: u64,
    pub profiles: &'a [wgpu_collectives::Profile],
}

/// Everything measured, as one JSON document: the run's parameters, the
/// engine's version, where the ranks ran, the ceiling, every row and the
/// time split.
pub fn json(
    a: &Args,
    world: &wgpu_collectives::World,
    ceiling: &Ceiling,
    rows: &[Row],
    avg_busbw: f64,
    split: Option<Split>,
) -> String {
    let adapters: Vec<serde_json::Value> = world
        .adapters()
        .iter()
        .map(|i| {
            serde_json::json!({
                "name": i.name,
                "backend": format!("{:?}", i.backend),
                "driver": i.driver,
            })
        })
        .collect();
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "size": r.bytes,
                "count": r.count,
                "type": r.dtype.name(),
                "redop": r.op.map(|o| o.name()),
                "root": r.root,
                "out_of_place": timing(&r.out_of_place),
                "in_place": r.in_place.as_ref().map(timing),
                "plan": r.plan.map(|p| p.name()),
                "chosen": r.chosen,
            })
        })
        .collect();
    let ms = |d: std::time::Duration, n: u64| d.as_secs_f64() * 1e3 / n.max(1) as f64;
    let split = split.map(|sp| {
        let ranks: Vec<serde_json::Value> = sp
            .profiles
            .iter()
            .map(|p| {
                serde_json::json!({
                    "kernels_ms": ms(p.kernels, p.collectives),
                    "transfers_ms": ms(p.transfers, p.collectives),
                    "waiting_ms": ms(p.waiting, p.collectives),
                    "gpu_timestamps": p.gpu_timestamps,
                })
            })
            .collect();
        serde_json::json!({ "size": sp.bytes, "per_collective_per_rank": ranks })
    });
    let doc = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "collective": a.collective.name(),
        "ranks": world.size(),
        "parameters": {
            "min_bytes": a.min_bytes,
            "max_bytes": a.max_bytes,
            "factor": a.step_bytes.is_none().then_some(a.factor),
            "step_bytes": a.step_bytes,
            "iters": a.iters,
            "warmup_iters": a.warmup,
            "check_iters": a.check,
            "op": a.op,
            "dtype": a.dtype,
            "root": a.collective.rooted().then_some(match a.roots {
                super::args::Roots::One(r) => serde_json::json!(r),
                super::args::Roots::All => serde_json::json!("all"),
            }),
            "timeout_s": a.timeout,
        },
        "placement": world.placement().name(),
        "transport": world.transport(),
        "algorithm": format!("{:?}", world.algorithm()),
        "forced_plan": world.plan().map(|p| p.name()),
        "adapters": adapters,
        "ceiling": {
            "bytes": ceiling.bytes,
            "device_copy_gbps": finite(ceiling.device_copy),
            "host_memcpy_gbps": finite(ceiling.host_memcpy),
            "round_trip_gbps": finite(ceiling.round_trip),
            "fence_us": finite(ceiling.fence_us),
            "busbw_gbps": finite(ceiling.busbw),
            "why": ceiling.why,
        },
        "rows": rows,
        "avg_busbw_gbps": finite(avg_busbw),
        "time_split": split,
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

/// Okabe and Ito's palette, which readers with any common colour-vision
/// deficiency can tell apart (no red against green).
const OKABE_ITO: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(240, 228, 66),
];

/// busbw against size for each (dtype, op, placement) measured, with the
/// ceiling as a line, written as an SVG to `path`: ticks at the measured
/// sizes, the adapter and placement in the title, and a log y axis when
/// the ceiling dwarfs the data.
#[allow(clippy::too_many_arguments)]
pub fn plot(
    path: &str,
    collective: &str,
    ranks: usize,
    adapter: &str,
    placement: &str,
    ceiling: &Ceiling,
    rows: &[Row],
) -> Result<(), String> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let op = r.op.map_or(String::new(), |o| format!(" {}", o.name()));
        let root = r.root.map_or(String::new(), |x| format!(" root {x}"));
        let halves = [
            ("out-of-place", Some(&r.out_of_place)),
            ("in-place", r.in_place.as_ref()),
        ];
        for (how, t) in halves {
            let Some(t) = t else { continue };
            let name = format!("{}{op}{root} {how}", r.dtype.name());
            let point = (r.bytes.max(1) as f64, t.busbw);
            match series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pts)) => pts.push(point),
                None => series.push((name, vec![point])),
            }
        }
    }
    let mut sizes: Vec<f64> = rows.iter().map(|r| r.bytes.max(1) as f64).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    let xmin = sizes.first().copied().unwrap_or(1.0);
    let xmax = sizes.last().copied().unwrap_or(1.0).max(xmin * 1.0001);
    let ys = || series.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y));
    let data_max = ys().fold(0.0, f64::max);
    // The ceiling ten times above the data would flatten it on a linear axis.
    let dwarfed = ceiling.busbw > 10.0 * data_max && data_max > 0.0;
    let title = format!("{collective}, {ranks} ranks on {adapter} ({placement}): bus bandwidth");

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("drawing {path}: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64);
    let x = (xmin / 1.05..xmax * 1.05)
        .log_scale()
        .with_key_points(sizes.clone());
    // The same drawing on either y axis (their coordinate types differ).
    macro_rules! draw {
        ($chart:expr, $ydesc:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc("size (log scale)")
                .y_desc($ydesc)
                .x_label_formatter(&|v| human(*v))
                .label_style(("sans-serif", 15))
                .axis_desc_style(("sans-serif", 16))
                .draw()
                .map_err(|e| err(&e))?;
            chart
                .draw_series(LineSeries::new(
                    [(xmin, ceiling.busbw), (xmax, ceiling.busbw)],
                    BLACK.stroke_width(2),
                ))
                .map_err(|e| err(&e))?
                .label(format!("ceiling {:.3} GB/s", ceiling.busbw))
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
            for (i, (name, pts)) in series.iter().enumerate() {
                let color = OKABE_ITO[i % OKABE_ITO.len()].to_rgba();
                chart
                    .draw_series(
                        LineSeries::new(pts.iter().copied(), color.stroke_width(2)).point_size(3),
                    )
                    .map_err(|e| err(&e))?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    if dwarfed {
        let ymin = ys().filter(|&y| y > 0.0).fold(data_max, f64::min) / 2.0;
        let chart = builder
            .build_cartesian_2d(x, (ymin..ceiling.busbw * 2.0).log_scale())
            .map_err(|e| err(&e))?;
        draw!(chart, "busbw (GB/s, log scale)");
    } else {
        let ymax = data_max.max(ceiling.busbw).max(1e-6) * 1.15;
        let chart = builder
            .build_cartesian_2d(x, 0.0..ymax)
            .map_err(|e| err(&e))?;
        draw!(chart, "busbw (GB/s)");
    }
    root.present().map_err(|e| err(&e))
}

fn human(bytes: f64) -> String {
    super::ceiling::size(bytes.round() as u64)
}

/// Each rank's last-step timeline as two lanes (compute, communication)
/// of bars, an SVG at `path`.
pub fn timeline(
    path: &str,
    ranks: &[(usize, &[wgpu_collectives::graph::Event])],
) -> Result<(), String> {
    use wgpu_collectives::graph::Lane;
    let end = ranks
        .iter()
        .flat_map(|(_, e)| e.iter().map(|e| e.end_us))
        .fold(1.0f64, f64::max)
        / 1e3;
    let lanes = ranks.len() * 2;
    let root = SVGBackend::new(path, (1000, 80 + 40 * lanes as u32)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("drawing {path}: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "one training step: compute and communication per rank",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(120)
        .build_cartesian_2d(0.0..end * 1.02, 0.0..lanes as f64)
        .map_err(|e| err(&e))?;
    let names: Vec<String> = ranks
        .iter()
        .flat_map(|(r, _)| [format!("rank {r} compute"), format!("rank {r} comm")])
        .collect();
    chart
        .configure_mesh()
        .x_desc("ms")
        // Ticks every half lane; the names go on the lanes' middles.
        .y_labels(lanes * 2 + 1)
        .y_label_formatter(&|y| {
            if (y.fract() - 0.5).abs() < 1e-6 {
                names.get(y.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .disable_y_mesh()
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (_, events)) in ranks.iter().enumerate() {
        for e in events.iter() {
            let (lane, color) = match e.lane {
                Lane::Compute => (2 * i, RGBColor(70, 130, 180)),
                Lane::Comm => (2 * i + 1, RGBColor(230, 120, 40)),
            };
            let y = lane as f64;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(e.start_us / 1e3, y + 0.15), (e.end_us / 1e3, y + 0.85)],
                    color.filled(),
                )))
                .map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))
}
