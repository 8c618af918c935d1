//! Command-line options, with nccl-tests' letters where it has them.

use clap::{Parser, ValueEnum};
use wgpu_collectives::{DType, ReduceOp};

/// Which collective to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Collective {
    /// all_reduce (ring: reduce-scatter then all-gather).
    AllReduce,
    /// all_gather (ring); the size is the gathered output.
    AllGather,
    /// reduce_scatter (ring); the size is each rank's input.
    ReduceScatter,
    /// broadcast from the root (chain along the ring).
    Broadcast,
    /// reduce to the root (chain along the ring).
    Reduce,
    /// all_to_all with equal splits; the size is each rank's input.
    AllToAll,
    /// nccl-tests' sendrecv_perf: each rank sends to the next and receives
    /// from the previous, in one group; the size is what each rank sends.
    Sendrecv,
    /// gather to the root; the size is the gathered output.
    Gather,
    /// scatter from the root; the size is the root's input.
    Scatter,
    /// all_gather_v with counts that grow by rank (rank r gives
    /// r+1 shares); the size is the gathered output.
    AllGatherV,
    /// reduce_scatter_v with counts that grow by rank; the size is each
    /// rank's input.
    ReduceScatterV,
}

impl Collective {
    /// busbw = algbw x this factor (nccl-tests' PERFORMANCE.md).
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::Gather
            | Collective::Scatter
            | Collective::AllGatherV
            | Collective::ReduceScatterV => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::Sendrecv => 1.0,
        }
    }

    /// Name in the table's title.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all_to_all",
            Collective::Sendrecv => "sendrecv",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllGatherV => "all_gather_v",
            Collective::ReduceScatterV => "reduce_scatter_v",
        }
    }

    /// Whether the collective reduces (takes an op).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce
                | Collective::ReduceScatter
                | Collective::Reduce
                | Collective::ReduceScatterV
        )
    }

    /// Whether it has an in-place form.
    /// Whether it has an in-place form (the output is the input): all_gather
    /// and reduce_scatter's (an input inside the output) are refused by the
    /// engine, so they have none here.
    pub fn has_in_place(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce
        )
    }

    /// Whether it has a root.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }
}

/// Which roots the rooted collectives run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Roots {
    /// One root.
    One(usize),
    /// Every rank in turn.
    All,
}

impl Roots {
    /// The roots, for a world of `ranks`.
    pub fn list(self, ranks: usize) -> Vec<usize> {
        match self {
            Roots::One(r) => vec![r],
            Roots::All => (0..ranks).collect(),
        }
    }
}

fn parse_roots(s: &str) -> Result<Roots, String> {
    if s == "all" {
        return Ok(Roots::All);
    }
    s.parse()
        .map(Roots::One)
        .map_err(|_| format!("{s:?} is not a rank or `all`"))
}

/// nccl-tests for wgpu: measures a collective over simulated ranks on any
/// Vulkan, Metal or DX12 adapter and prints the nccl-tests table.
#[derive(Debug, Clone, Parser)]
#[command(
    version,
    about,
    after_help = "Subcommands:\n  ddp    data-parallel MLP training on the graph layer, eager against \
                  overlapped schedules (`wgpu-collectives ddp --help` for its options)\n  \
                  tune   time every plan on this machine (or read the cached table) and print the \
                  tuning table (`wgpu-collectives tune --help`)\n\n\
                  Environment variables:\n  \
                  WGPU_BACKEND                   wgpu backends to look on (vulkan, metal, dx12, gl)\n  \
                  WGPU_ADAPTER_NAME              only adapters whose name contains it (llvmpipe)\n  \
                  WGPU_COLLECTIVES_PLACEMENT     auto, shared or per-rank (or --placement)\n  \
                  WGPU_COLLECTIVES_PLAN          force a plan (or --plan): auto, direct, device-ring, host-ring, one-shot,\n  \
                                                 chain, pairwise, star, two-level (where the collective offers it)\n  \
                  WGPU_COLLECTIVES_FOLD_ORDER    canonical or fastest (or --fold-order): fastest lets floats take\n  \
                                                 two-level plans across processes, whose bits depend on the layout\n  \
                  WGPU_COLLECTIVES_TUNE          time the plans when the world is made: off, cached, measure\n  \
                  WGPU_COLLECTIVES_TUNE_CACHE    where tuning tables are cached (~/.cache/wgpu-collectives)\n  \
                  WGPU_COLLECTIVES_ALGO          all-reduce algorithm: auto, ring, oneshot, direct\n  \
                  WGPU_COLLECTIVES_DEBUG         logs on stderr: info, debug, trace, or a filter\n  \
                  RUST_LOG                       the same, when WGPU_COLLECTIVES_DEBUG is unset\n  \
                  WGPU_COLLECTIVES_FLIGHT_DEPTH  collectives each rank's flight record keeps (64)\n  \
                  WGPU_COLLECTIVES_FLIGHT_DUMP   where a failure writes the flight record (JSON)"
)]
pub struct Args {
    /// The collective to measure.
    #[arg(value_enum, default_value = "all-reduce")]
    pub collective: Collective,

    /// Smallest message size in bytes (K, M, G suffixes: powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "1K", value_parser = parse_bytes)]
    pub min_bytes: u64,

    /// Largest message size in bytes (K, M, G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_bytes)]
    pub max_bytes: u64,

    /// Multiply the size by this factor between rows.
    #[arg(
        short = 'f',
        long = "stepfactor",
        default_value_t = 4,
        conflicts_with = "step_bytes"
    )]
    pub factor: u64,

    /// Add this many bytes between rows instead of multiplying.
    #[arg(short = 'i', long = "stepbytes", value_parser = parse_bytes)]
    pub step_bytes: Option<u64>,

    /// Timed iterations per size (the time printed is their mean).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,

    /// Untimed warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,

    /// Check the result this many times per size (0: no check; #wrong prints N/A).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: usize,

    /// Reduction: sum, prod, min, max, avg, band, bor, bxor, or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,

    /// Element type: f32 (float), f16 (half), bf16, i32, u32, or all.
    #[arg(short = 'd', long = "datatype", default_value = "f32")]
    pub dtype: String,

    /// Root rank of broadcast and reduce, or `all`: a row per root.
    #[arg(short = 'r', long = "root", default_value = "0", value_parser = parse_roots)]
    pub roots: Roots,

    /// The root of the row being measured (one of `roots`).
    #[arg(skip)]
    pub root: usize,

    /// Number of simulated ranks.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,

    /// wgpu backend (vulkan, metal, dx12, gl); default: WGPU_BACKEND, else all primary ones.
    #[arg(long)]
    pub backend: Option<String>,

    /// Use only adapters whose name contains this; default: WGPU_ADAPTER_NAME.
    #[arg(long)]
    pub adapter: Option<String>,

    /// Force a plan (as WGPU_COLLECTIVES_PLAN does), or `all`: a row per
    /// plan that can run each size, the one the planner chose marked `*`
    /// (as nccl-tests users sweep NCCL_ALGO).
    #[arg(long, value_name = "PLAN|all")]
    pub plan: Option<String>,

    /// Where the ranks run (as WGPU_COLLECTIVES_PLACEMENT): auto, shared
    /// or per-rank.
    #[arg(long, value_name = "PLACEMENT")]
    pub placement: Option<String>,

    /// The fold orders collectives may take (as
    /// WGPU_COLLECTIVES_FOLD_ORDER): canonical, or fastest, which lets a
    /// world over MPI all-reduce floats in two levels (its bits then
    /// depend on the process layout).
    #[arg(long, value_name = "ORDER")]
    pub fold_order: Option<String>,

    /// Seconds any collective may wait for its peers.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,

    /// Write every row and the ceiling figures to this file as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,

    /// Draw busbw against size (log axis) with the ceiling, as an SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<String>,

    /// Exit with status 3 when the average busbw (GB/s) is below this.
    #[arg(long = "min-bw", value_name = "GB/s")]
    pub min_bw: Option<f64>,

    /// Testing aid: count every checked element as wrong (the exit status
    /// must then say so).
    #[arg(long, hide = true)]
    pub corrupt: bool,
}

/// "64M" -> 67108864.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("not a byte count: {s:?} (examples: 1024, 4K, 64M, 1G)"))
}

/// The reductions named by `-o`.
pub fn ops(s: &str) -> Result<Vec<ReduceOp>, String> {
    if s == "all" {
        return Ok(ReduceOp::ALL.to_vec());
    }
    ReduceOp::ALL
        .into_iter()
        .find(|op| op.name() == s)
        .map(|op| vec![op])
        .ok_or_else(|| {
            format!("unknown op {s:?}: sum, prod, min, max, avg, band, bor, bxor or all")
        })
}

/// The dtypes named by `-d`.
pub fn dtypes(s: &str) -> Result<Vec<DType>, String> {
    Ok(match s {
        "all" => DType::ALL.to_vec(),
        "f32" | "float" | "float32" => vec![DType::F32],
        "f16" | "half" | "float16" => vec![DType::F16],
        "bf16" | "bfloat16" => vec![DType::BF16],
        "i32" | "int32" | "int" => vec![DType::I32],
        "u32" | "uint32" => vec![DType::U32],
        _ => {
            return Err(format!(
                "unknown datatype {s:?}: f32, f16, bf16, i32, u32 or all"
            ));
        }
    })
}

/// The message sizes of the sweep.
pub fn sizes(a: &Args) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = a.min_bytes;
    while s <= a.max_bytes {
        v.push(s);
        s = match a.step_bytes {
            Some(step) if step > 0 => s + step,
            Some(_) => break,
            None if a.factor > 1 => s.saturating_mul(a.factor),
            None => break,
        };
    }
    v
}
