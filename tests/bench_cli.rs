//! The benchmark binary as a user runs it: arguments, the table (parsed
//! back), --json, --plot, and the exit status.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wgpu-collectives"))
        .args(args)
        .output()
        .expect("the benchmark binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The plan's column in a data row.
const PLAN: usize = 13;

/// The table's data rows, split into columns.
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|t| t.chars().all(|c| c.is_ascii_digit()))
        })
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("wgpu-collectives-{}-{name}", std::process::id()))
}

#[test]
fn the_table_has_the_nccl_tests_columns_and_a_row_per_size() {
    let o = bench(&[
        "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "--ranks", "2",
    ]);
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let header = out
        .lines()
        .find(|l| l.contains("busbw"))
        .expect("a header with busbw");
    let cols: Vec<&str> = header.trim_start_matches('#').split_whitespace().collect();
    assert_eq!(
        &cols[..9],
        [
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
        ],
        "{header}"
    );
    assert!(
        out.contains("#  Rank  1 on"),
        "each rank's adapter in the header:\n{out}"
    );
    // After the plan, how the timed batches varied: iqr (%), min and max
    // time per call (us), min <= max, the row's mean between them.
    assert_eq!(&cols[13..], ["plan", "iqr", "min", "max"], "{header}");
    for r in rows(&out) {
        let f = |i: usize| r[i].parse::<f64>().unwrap_or_else(|_| panic!("{r:?}"));
        assert!(f(14) >= 0.0, "{r:?}");
        assert!(f(15) <= f(16), "{r:?}");
        assert!(
            f(15) <= f(5) * 1.0001 + 0.1 && f(5) <= f(16) * 1.0001 + 0.1,
            "{r:?}"
        );
    }
    for line in [
        "device copy",
        "host memcpy",
        "host-device-host round trip",
        "fence round trip",
        "bus bandwidth ceiling",
    ] {
        assert!(out.contains(line), "ceiling line {line:?} missing:\n{out}");
    }
    let r = rows(&out);
    let sizes: Vec<&str> = r.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(sizes, ["1024", "4096", "16384"], "{out}");
    for c in &r {
        // The plan that ran, then the batches' spread.
        assert_eq!(c.len(), 17, "{c:?}");
        assert!(wgpu_collectives::Plan::parse(&c[13]).is_some(), "{c:?}");
        assert_eq!(
            (c[2].as_str(), c[3].as_str(), c[4].as_str()),
            ("float", "sum", "-1")
        );
        assert_eq!(
            c[1].parse::<u64>().expect("count") * 4,
            c[0].parse::<u64>().expect("size")
        );
        let (algbw, busbw): (f64, f64) =
            (c[6].parse().expect("algbw"), c[7].parse().expect("busbw"));
        // busbw = algbw x 2(n-1)/n = algbw on 2 ranks (to the printed precision).
        assert!((busbw - algbw).abs() <= 0.0015, "{c:?}");
        assert_eq!((c[8].as_str(), c[12].as_str()), ("0", "0"), "#wrong: {c:?}");
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
    assert!(out.contains("# Time split at 16384 B"), "{out}");
}

#[test]
fn every_collective_runs_and_checks_its_result() {
    for (coll, redop, root) in [
        ("all-gather", "none", "-1"),
        ("reduce-scatter", "max", "-1"),
        ("broadcast", "none", "1"),
        ("reduce", "max", "1"),
        ("all-to-all", "none", "-1"),
        ("all-gather-v", "none", "-1"),
        ("reduce-scatter-v", "max", "-1"),
    ] {
        let o = bench(&[
            coll, "-b", "3K", "-e", "3K", "-n", "1", "-w", "0", "--ranks", "3", "-o", "max", "-d",
            "i32", "-r", "1",
        ]);
        let out = stdout(&o);
        assert!(
            o.status.success(),
            "{coll}: {out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = rows(&out);
        assert_eq!(r.len(), 1, "{coll}: {out}");
        assert_eq!(
            (
                r[0][2].as_str(),
                r[0][3].as_str(),
                r[0][4].as_str(),
                r[0][8].as_str()
            ),
            ("int32", redop, root, "0"),
            "{coll}: {out}"
        );
        if matches!(coll, "broadcast" | "reduce") {
            // In place: the output is the input (broadcast_into(x, x, ..)).
            assert_ne!(r[0][9], "N/A", "{coll} has an in-place form: {out}");
            assert_eq!(r[0][12], "0", "{coll} in place: {out}");
        } else {
            assert_eq!(r[0][9], "N/A", "{coll} has no in-place form: {out}");
        }
    }
}

#[test]
fn json_holds_every_row_and_the_ceiling() {
    let path = temp("rows.json");
    let o = bench(&[
        "-b",
        "1K",
        "-e",
        "4K",
        "-n",
        "1",
        "-w",
        "0",
        "--ranks",
        "2",
        "-d",
        "all",
        "-o",
        "sum",
        "--json",
        path.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("json written"))
            .expect("valid JSON");
    std::fs::remove_file(&path).ok();
    assert_eq!(doc["collective"], "all_reduce");
    assert_eq!(doc["ranks"], 2);
    assert_eq!(doc["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(doc["parameters"]["min_bytes"], 1024);
    assert_eq!(doc["parameters"]["max_bytes"], 4096);
    assert_eq!(doc["parameters"]["iters"], 1);
    assert_eq!(doc["parameters"]["dtype"], "all");
    assert!(
        doc["placement"] == "shared" || doc["placement"] == "per-rank",
        "{}",
        doc["placement"]
    );
    assert!(doc["transport"].as_str().is_some_and(|t| !t.is_empty()));
    let split = &doc["time_split"];
    assert_eq!(split["size"], 4096, "the split is of the last row's size");
    let per_rank = split["per_collective_per_rank"]
        .as_array()
        .expect("per rank");
    assert_eq!(per_rank.len(), 2);
    assert!(per_rank[0]["transfers_ms"].as_f64().expect("transfers") >= 0.0);
    assert_eq!(doc["adapters"].as_array().expect("adapters").len(), 2);
    assert!(doc["ceiling"]["host_memcpy_gbps"].as_f64().expect("memcpy") > 0.0);
    assert!(doc["ceiling"]["fence_us"].as_f64().expect("fence") > 0.0);
    let table = rows(&stdout(&o));
    let json_rows = doc["rows"].as_array().expect("rows");
    assert_eq!(json_rows.len(), 2 * 5, "two sizes x five dtypes");
    assert_eq!(table.len(), json_rows.len());
    for (row, line) in json_rows.iter().zip(&table) {
        assert_eq!(row["size"].to_string(), line[0]);
        assert_eq!(row["type"].as_str(), Some(line[2].as_str()));
        assert_eq!(row["out_of_place"]["wrong"], 0);
        assert!(row["in_place"]["busbw_gbps"].as_f64().is_some());
        // The plan that ran, as the table names it.
        assert_eq!(row["plan"].as_str(), Some(line[13].as_str()));
    }
}

/// Start and end tags balance, and there is something drawn.
fn well_formed_svg(svg: &str) -> Result<(), String> {
    if !svg.trim_start().starts_with("<svg") || !svg.trim_end().ends_with("</svg>") {
        return Err("not an <svg> document".into());
    }
    let mut stack = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find('<') {
        let j = rest[i..].find('>').ok_or("unclosed tag")? + i;
        let tag = &rest[i + 1..j];
        if let Some(name) = tag.strip_prefix('/') {
            if stack.pop() != Some(name.trim().to_string()) {
                return Err(format!("</{name}> closes the wrong element"));
            }
        } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
            stack.push(tag.split_whitespace().next().unwrap_or("").to_string());
        }
        rest = &rest[j + 1..];
    }
    if !stack.is_empty() {
        return Err(format!("unclosed elements: {stack:?}"));
    }
    if !svg.contains("<polyline") && !svg.contains("<path") {
        return Err("no line drawn".into());
    }
    Ok(())
}

#[test]
fn plot_is_a_well_formed_svg_with_the_ceiling() {
    let path = temp("plot.svg");
    let o = bench(&[
        "-b",
        "1K",
        "-e",
        "16K",
        "-n",
        "1",
        "-w",
        "0",
        "--ranks",
        "2",
        "--plot",
        path.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
    let svg = std::fs::read_to_string(&path).expect("svg written");
    std::fs::remove_file(&path).ok();
    well_formed_svg(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert!(svg.contains("ceiling"), "the ceiling is labelled");
    assert!(
        svg.contains("float sum out-of-place") && svg.contains("float sum in-place"),
        "both series are labelled"
    );
    // Ticks at the measured sizes, in KiB; the adapter and placement in the title.
    for tick in ["1 KiB", "4 KiB", "16 KiB"] {
        assert!(svg.contains(tick), "no tick {tick:?}");
    }
    assert!(
        svg.contains("ranks on ") && (svg.contains("(shared)") || svg.contains("(per-rank)")),
        "the title"
    );
    // The two series in Okabe-Ito blue and orange, which colour-blind
    // readers tell apart (not a red against a green), and no text smaller
    // than 11 px (plotters' default tick labels come out under 10).
    let svg_lower = svg.to_lowercase();
    assert!(
        svg_lower.contains("#0072b2") && svg_lower.contains("#e69f00"),
        "the series' colours"
    );
    let sizes: Vec<f64> = svg
        .split("font-size=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect();
    assert!(
        !sizes.is_empty() && sizes.iter().all(|&px| px >= 11.0),
        "text of at least 11 px: {sizes:?}"
    );
}

#[test]
fn wrong_results_and_low_bandwidth_set_the_exit_status() {
    let o = bench(&[
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-w",
        "0",
        "--ranks",
        "2",
        "--corrupt",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("FAILED"));
    let r = rows(&stdout(&o));
    // #wrong adds up every rank's wrong elements, as nccl-tests does.
    assert_eq!(
        r[0][8], "512",
        "every element of both ranks counted wrong: {:?}",
        r[0]
    );

    let o = bench(&[
        "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--ranks", "2", "--min-bw", "1000000",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    for (args, says) in [
        (vec!["-o", "median"], "unknown op"),
        (vec!["-d", "f64"], "unknown datatype"),
        (vec!["-b", "1X"], "not a byte count"),
        (vec!["broadcast", "-r", "9", "--ranks", "2"], "root 9"),
        (vec!["broadcast", "-r", "first"], "not a rank or `all`"),
        (vec!["-b", "64K", "-e", "4K"], "is above -e"),
    ] {
        let o = bench(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn help_lists_the_ddp_subcommand() {
    let o = bench(&["--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    assert!(
        help.contains("Subcommands:") && help.contains("ddp "),
        "{help}"
    );
    for var in [
        "WGPU_BACKEND",
        "WGPU_ADAPTER_NAME",
        "WGPU_COLLECTIVES_PLACEMENT",
        "WGPU_COLLECTIVES_ALGO",
        "WGPU_COLLECTIVES_PLAN",
        "WGPU_COLLECTIVES_DEBUG",
        "WGPU_COLLECTIVES_FLIGHT_DUMP",
    ] {
        assert!(help.contains(var), "--help does not mention {var}:\n{help}");
    }
}

#[test]
fn the_ddp_timeline_labels_every_lane() {
    let path = temp("timeline.svg");
    let o = bench(&[
        "ddp",
        "--ranks",
        "2",
        "--layers",
        "2",
        "--hidden",
        "16",
        "--batch",
        "8",
        "--steps",
        "1",
        "--timeline",
        path.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
    let svg = std::fs::read_to_string(&path).expect("the timeline written");
    std::fs::remove_file(&path).ok();
    well_formed_svg(&svg).expect("a well-formed SVG");
    for lane in [
        "rank 0 compute",
        "rank 0 comm",
        "rank 1 compute",
        "rank 1 comm",
    ] {
        assert!(svg.contains(lane), "no {lane:?} label");
    }
}

#[test]
fn the_ceiling_is_measured_at_the_size_it_is_compared_with() {
    let path = temp("small.json");
    let o = bench(&[
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-w",
        "0",
        "--ranks",
        "2",
        "--json",
        path.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("json written"))
            .expect("valid JSON");
    std::fs::remove_file(&path).ok();
    assert_eq!(
        doc["ceiling"]["bytes"], 1024,
        "not a 1 MiB copy for a 1 KiB run"
    );
    let out = stdout(&o);
    assert!(out.contains("copies of 1 KiB"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("# Best bus bandwidth") && l.ends_with("ceiling at 1 KiB")),
        "{out}"
    );
}

#[test]
fn the_time_split_reports_the_rows_real_size() {
    let path = temp("split.json");
    // 1000 B of f32 over 3 ranks: reduce_scatter moves 249 elements, 996 B.
    let o = bench(&[
        "reduce-scatter",
        "-b",
        "1000",
        "-e",
        "1000",
        "-n",
        "1",
        "-w",
        "0",
        "--ranks",
        "3",
        "--json",
        path.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("json written"))
            .expect("valid JSON");
    std::fs::remove_file(&path).ok();
    assert_eq!(doc["rows"][0]["size"], 996);
    assert_eq!(doc["time_split"]["size"], 996);
    assert!(
        stdout(&o).contains("# Time split at 996 B"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn root_all_measures_every_root() {
    for coll in ["broadcast", "reduce"] {
        let o = bench(&[
            coll, "-r", "all", "--ranks", "3", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0",
        ]);
        let out = stdout(&o);
        assert!(o.status.success(), "{coll}: {out}");
        let r = rows(&out);
        let roots: Vec<&str> = r.iter().map(|row| row[4].as_str()).collect();
        assert_eq!(roots, ["0", "1", "2"], "{coll}: {out}");
        assert!(
            r.iter().all(|row| row[8] == "0" && row[12] == "0"),
            "{coll}: {out}"
        );
    }
}

/// `--plan all` prints a row per plan that runs each size, and marks the
/// planner's choice on exactly one of them; `--plan` and `--placement`
/// force what they name, and a name they do not know is refused.
#[test]
fn plan_all_rows_every_plan_and_marks_the_choice() {
    let o = bench(&[
        "-b",
        "4K",
        "-e",
        "64K",
        "-f",
        "16",
        "-n",
        "2",
        "-w",
        "1",
        "--ranks",
        "2",
        "--placement",
        "per-rank",
        "--plan",
        "all",
    ]);
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let table = rows(&out);
    for size in ["4096", "65536"] {
        let plans: Vec<&str> = table
            .iter()
            .filter(|r| r[0] == size)
            .map(|r| r.get(PLAN).map_or("", String::as_str))
            .collect();
        // A device per rank: every all-reduce plan but the direct kernels.
        let mut names: Vec<&str> = plans.iter().map(|p| p.trim_end_matches('*')).collect();
        names.sort_unstable();
        assert_eq!(names, ["device-ring", "host-ring", "one-shot"], "{out}");
        assert_eq!(
            plans.iter().filter(|p| p.ends_with('*')).count(),
            1,
            "{out}"
        );
    }
    let o = bench(&[
        "-b",
        "4K",
        "-e",
        "4K",
        "-n",
        "2",
        "-w",
        "1",
        "--ranks",
        "2",
        "--placement",
        "per-rank",
        "--plan",
        "one-shot",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        rows(&out)
            .iter()
            .all(|r| r.get(PLAN).is_some_and(|p| p == "one-shot")),
        "{out}"
    );
    for bad in [["--plan", "fastest"], ["--placement", "everywhere"]] {
        let o = bench(&["-b", "4K", "-e", "4K", "--ranks", "2", bad[0], bad[1]]);
        assert!(!o.status.success(), "{bad:?} was accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(bad[1]), "{bad:?}: {err}");
    }
}

/// `tune` times the plans into the cache folder it is given, prints the
/// table and where it is, and a second run prints the same table, read
/// from that file.
#[test]
fn tune_prints_the_table_and_its_cache_file() {
    let dir = temp("tune-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let tune = || {
        Command::new(env!("CARGO_BIN_EXE_wgpu-collectives"))
            .args(["tune", "--ranks", "2", "--placement", "per-rank"])
            .env("WGPU_COLLECTIVES_TUNE_CACHE", &dir)
            // The other tests load the machine: time whatever the load.
            .env("WGPU_COLLECTIVES_TUNE_BUSY", "100")
            .output()
            .expect("the benchmark binary runs")
    };
    let first = tune();
    let out = stdout(&first);
    assert!(
        first.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let path = out
        .lines()
        .find_map(|l| l.split("cached at ").nth(1))
        .unwrap_or_else(|| panic!("no cache file named: {out}"));
    assert!(path.starts_with(dir.to_str().expect("a path")), "{out}");
    let file = std::fs::read_to_string(path).expect("the cache file");
    assert!(file.starts_with("wgpu-collectives tuning 3\n"), "{file}");
    assert!(
        out.contains(&file),
        "the printed table is not the file's:\n{out}\n{file}"
    );
    for plan in ["device-ring", "host-ring", "one-shot", "chain"] {
        assert!(file.contains(plan), "{plan} was not timed: {file}");
    }
    assert!(
        !file.contains("direct"),
        "the direct kernels between devices: {file}"
    );
    assert!(out.contains("# age: measured "), "{out}");
    assert!(file.contains('~'), "no spread per point: {file}");
    // A table timed while the other tests loaded the machine may be
    // marked for a second look (the next run would measure again): trust
    // it here, as a quiet machine's would be.
    let trusted = file.replace("second-look\n", "");
    std::fs::write(path, &trusted).expect("the table, trusted");
    let second = stdout(&tune());
    assert!(
        second.contains(&trusted) && second.contains(path),
        "the second run did not read the cached table:\n{second}\n{trusted}"
    );
    assert_eq!(
        std::fs::read_to_string(path).expect("the cache file"),
        trusted,
        "the second run measured again"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
