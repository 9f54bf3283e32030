//! `graphsafe plan …`

use clap::Subcommand;
use graphsafe::ops::mla::{sm100, sm90, KvDtype, MlaArch};
use graphsafe::ops::nvfp4::{self, Nvfp4Arch};
use graphsafe::ops::tensor::DType;

#[derive(Subcommand)]
pub enum PlanOp {
    /// NVFP4 GEMM D[M,N] = A[M,K]·W[N,K]ᵀ: tile and workspace per M (Blackwell: CUTLASS block-scaled;
    /// Hopper: weight-only kernel, with the prepared weight's size).
    Nvfp4 {
        /// Rows of A, comma separated (e.g. 1,16,256,4096).
        #[arg(long, value_delimiter = ',', required = true, allow_negative_numbers = true)]
        m: Vec<i64>,
        /// Rows of W (output features), a multiple of 32.
        #[arg(long, allow_negative_numbers = true)]
        n: i64,
        /// Reduction length, a multiple of 32.
        #[arg(long, allow_negative_numbers = true)]
        k: i64,
        /// A row of the arch table (sm_90a, sm_100f, sm_120f) or a GPU's compute capability
        /// (sm_90, sm_100, sm_103, sm_120, sm_121).
        #[arg(long, default_value = "sm_100")]
        arch: String,
        /// Output dtype: bf16 or fp16 (sm_90: bf16).
        #[arg(long, default_value = "bf16")]
        out: String,
        /// SMs of the target GPU (default: the arch's reference GPU: H100/H200 132, B200 148, RTX 5090 170).
        #[arg(long = "sm-count", allow_negative_numbers = true)]
        sm_count: Option<i64>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// MLA decode: splits and workspace per batch, and the pre-grow maximum.
    Mla {
        /// Target: a row of the arch table or a GPU's compute capability with an MLA kernel:
        /// sm_100/sm_103 (B200, GB200, B300, GB300: CUTLASS's kernel) or sm_90 (H100/H200: graphsafe's).
        #[arg(long, default_value = "sm_100")]
        arch: String,
        /// Query heads (sm_100: 128; sm_90: a multiple of 16 up to 128).
        #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
        heads: i64,
        /// Batch sizes, comma separated (e.g. 1,8,64,128), each in 1..=65535.
        #[arg(long, value_delimiter = ',', required = true, allow_negative_numbers = true)]
        batch: Vec<i64>,
        /// Longest sequence length, 1..=2147483520.
        #[arg(long = "seq-len", allow_negative_numbers = true)]
        seq_len: i64,
        /// SMs of the target GPU (B200: 148), 1..=1024.
        #[arg(long = "sm-count", allow_negative_numbers = true)]
        sm_count: i64,
        /// Tokens per KV-cache page (sm_100: a power of two up to 128, sizing the sanitized page
        /// table in the workspace; sm_90: 64 or 128).
        #[arg(long = "page-size", default_value_t = 64, allow_negative_numbers = true)]
        page_size: i64,
        /// Element type of q and the KV cache: bf16, fp16 or fp8.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// Ask for this many KV splits instead of the default rule (validated against it).
        #[arg(long, allow_negative_numbers = true)]
        splits: Option<i64>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(op: PlanOp) -> i32 {
    match op {
        PlanOp::Nvfp4 { m, n, k, arch, out, sm_count, json } => match nvfp4_plan(&m, n, k, &arch, &out, sm_count, json) {
            Ok(()) => 0,
            Err(e) => crate::usage_error(&e),
        },
        PlanOp::Mla { arch, heads, batch, seq_len, sm_count, page_size, dtype, splits, json } => {
            let shape = MlaShape { batches: &batch, heads, seq_len, sm_count, page_size, splits };
            let r = match graphsafe::arch::plan_mla(&arch) {
                Ok(MlaArch::Sm100) => mla(&shape, &dtype, json),
                Ok(MlaArch::Sm90) => mla_sm90(&shape, &dtype, json),
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => 0,
                Err(e) => crate::usage_error(&e),
            }
        }
    }
}

/// What `plan mla` was asked for.
struct MlaShape<'a> {
    batches: &'a [i64],
    heads: i64,
    seq_len: i64,
    sm_count: i64,
    page_size: i64,
    splits: Option<i64>,
}

fn mla(a: &MlaShape, dtype: &str, json: bool) -> graphsafe::Result<()> {
    let dtype: KvDtype = dtype.parse()?;
    if a.heads != 128 {
        return Err(graphsafe::Error::invalid("heads", "128 for sm_100 (pad fewer heads up to 128)", a.heads));
    }
    let (seq_len, sm_count) = (a.seq_len, a.sm_count);
    let plans = a.batches.iter().map(|&b| sm100::plan(dtype, b, seq_len, a.page_size, sm_count, a.splits)).collect::<graphsafe::Result<Vec<_>>>()?;
    let max_batch = *a.batches.iter().max().expect("clap requires at least one batch");
    // The same split request as the rows: an engine that captures with --splits needs that much.
    let worst = sm100::worst_case(dtype, max_batch, seq_len, a.page_size, sm_count, a.splits)?;
    let pre = PreGrow::new(worst.workspace_bytes, a, max_batch, (worst.batch, worst.max_seq_len, worst.num_splits));
    if json {
        println!("{}", pre.json("cutlass-4.2-sm100", dtype, a, serde_json::json!(plans)));
        return Ok(());
    }
    println!("MLA decode plan: CUTLASS 4.2 sm100 kernel, {dtype}, max seq len {seq_len}, page size {}, {sm_count} SMs", a.page_size);
    println!("{:>8} {:>7} {:>11} {:>16}", "batch", "splits", "scheduler", "workspace bytes");
    for p in &plans {
        let sched = match p.scheduler {
            sm100::Scheduler::Persistent => "persistent",
            sm100::Scheduler::Individual => "individual",
        };
        println!("{:>8} {:>7} {:>11} {:>16}", p.batch, p.num_splits, sched, p.workspace_bytes);
    }
    println!("{}", pre.line());
    Ok(())
}

fn mla_sm90(a: &MlaShape, dtype: &str, json: bool) -> graphsafe::Result<()> {
    let dtype: KvDtype = dtype.parse()?;
    if a.page_size != 64 && a.page_size != 128 {
        return Err(graphsafe::Error::invalid("page-size", "64 or 128 for sm_90", a.page_size));
    }
    let (heads, seq_len, sm_count) = (a.heads, a.seq_len, a.sm_count);
    let plans = a.batches.iter().map(|&b| sm90::plan(dtype, heads, b, seq_len, sm_count, a.splits)).collect::<graphsafe::Result<Vec<_>>>()?;
    let max_batch = *a.batches.iter().max().expect("clap requires at least one batch");
    let worst = sm90::worst_case(dtype, heads, max_batch, seq_len, sm_count, a.splits)?;
    let pre = PreGrow::new(worst.workspace_bytes, a, max_batch, (worst.batch, worst.max_seq_len, worst.num_splits));
    if json {
        println!("{}", pre.json("graphsafe-sm90", dtype, a, serde_json::json!(plans)));
        return Ok(());
    }
    println!("MLA decode plan: graphsafe sm90 kernel, {dtype}, {heads} heads, max seq len {seq_len}, {sm_count} SMs");
    println!("{:>8} {:>7} {:>16}", "batch", "splits", "workspace bytes");
    for p in &plans {
        println!("{:>8} {:>7} {:>16}", p.batch, p.num_splits, p.workspace_bytes);
    }
    println!("{}", pre.line());
    Ok(())
}

fn nvfp4_plan(ms: &[i64], n: i64, k: i64, arch: &str, out: &str, sm_count: Option<i64>, json: bool) -> graphsafe::Result<()> {
    let target = graphsafe::arch::parse_target(arch);
    let arch: Nvfp4Arch = graphsafe::arch::plan_nvfp4(arch)?;
    let out = match out {
        "bf16" => DType::Bf16,
        "fp16" => DType::Fp16,
        other => return Err(graphsafe::Error::invalid("out", "bf16 or fp16", other)),
    };
    let sms = sm_count.unwrap_or(target.map_or(0, |t| t.sm_count as i64));
    let plans = ms.iter().map(|&m| nvfp4::plan(arch, m, n, k, out, sms)).collect::<graphsafe::Result<Vec<_>>>()?;
    if json {
        let v = serde_json::json!({ "op": "nvfp4", "arch": arch, "n": n, "k": k, "sm_count": sms, "plans": plans });
        println!("{}", serde_json::to_string_pretty(&v).expect("plain JSON values serialize"));
        return Ok(());
    }
    println!("NVFP4 GEMM plan: {arch:?}, N {n}, K {k}, {sms} SMs, {out} out");
    println!("{:>8} {:>22} {:>16} {:>16}", "m", "tile (cluster)", "workspace bytes", "prepared weight");
    for p in &plans {
        let tile = p.tile.map_or("weight-only kernel".to_string(), |t| format!("{}x{}x{} ({}x{})", t.m, t.n, t.k, t.cluster_m, t.cluster_n));
        let prep = p.prepared_weight_bytes.map_or("-".to_string(), |b| b.to_string());
        println!("{:>8} {:>22} {:>16} {:>16}", p.m, tile, p.workspace_bytes, prep);
    }
    Ok(())
}

/// What both MLA planners print: the JSON document, or the pre-grow line after the table.
struct PreGrow {
    bytes: u64,
    max_batch: i64,
    seq_len: i64,
    splits: Option<i64>,
    worst_batch: u32,
    worst_seq_len: u32,
    worst_splits: u32,
}

impl PreGrow {
    /// The worst case covers every printed row: each row is a shape of its domain (batch up to
    /// the largest listed, the longest length), planned with the same split request.
    fn new(bytes: u64, a: &MlaShape, max_batch: i64, (worst_batch, worst_seq_len, worst_splits): (u32, u32, u32)) -> PreGrow {
        PreGrow { bytes, max_batch, seq_len: a.seq_len, splits: a.splits, worst_batch, worst_seq_len, worst_splits }
    }

    fn json(&self, kernel: &str, dtype: KvDtype, a: &MlaShape, plans: serde_json::Value) -> String {
        let v = serde_json::json!({
            "op": "mla",
            "kernel": kernel,
            "dtype": dtype,
            "heads": a.heads,
            "seq_len": self.seq_len,
            "page_size": a.page_size,
            "sm_count": a.sm_count,
            "splits": self.splits,
            "plans": plans,
            "pre_grow": {
                "workspace_bytes": self.bytes,
                "over_batches": format!("1..={}", self.max_batch),
                "over_seq_lens": format!("1..={}", self.seq_len),
                "num_splits": self.splits.map_or("default rule".to_string(), |n| n.to_string()),
                "worst_batch": self.worst_batch,
                "worst_seq_len": self.worst_seq_len,
                "worst_num_splits": self.worst_splits,
            }
        });
        serde_json::to_string_pretty(&v).expect("plain JSON values serialize")
    }

    fn line(&self) -> String {
        let rule = self.splits.map_or(String::new(), |n| format!(" with {n} splits"));
        format!(
            "pre-grow before capture: {} bytes (worst case over batch 1..={} and seq len 1..={}{rule}: batch {}, seq len {}, {} splits)",
            self.bytes, self.max_batch, self.seq_len, self.worst_batch, self.worst_seq_len, self.worst_splits
        )
    }
}
