//! `graphsafe plan …`

use clap::Subcommand;
use graphsafe::ops::mla::{self as mla, sm100, KvDtype, KvFormatKind, MlaArch, MlaDecodePlan, MlaLimits};
use graphsafe::ops::nvfp4::{self, Nvfp4Arch};
use graphsafe::ops::tensor::DType;

#[derive(Subcommand)]
pub enum PlanOp {
    /// NVFP4 GEMM D[M,N] = A[M,K]·W[N,K]ᵀ: tile and workspace per M (Blackwell: CUTLASS block-scaled;
    /// Hopper: the weight-only kernel's schedule, with the prepared weight's size).
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
        /// Query heads, 1..=128 (sm_100 pads fewer to 128 in the workspace).
        #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
        heads: i64,
        /// Query tokens per request (MTP / speculative decode), 1..=16 (sm_100 runs each as a
        /// request of its own: --batch x --s-q at most 65535). The pre-grow size covers every
        /// count up to it.
        #[arg(long = "s-q", default_value_t = 1, allow_negative_numbers = true)]
        s_q: i64,
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
        /// Element type of q (and of a native KV cache): bf16, fp16 or fp8.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// How the KV cache is stored: native (in --dtype), fp8 (e4m3 with one f32 scale) or
        /// fp8-ds-mla (DeepSeek V3.2's 656-byte token). The fp8 formats: sm_90, bf16 q, every head
        /// count; the workspace does not depend on the format.
        #[arg(long = "kv-format", default_value = "native")]
        kv_format: String,
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
        PlanOp::Mla { arch, heads, s_q, batch, seq_len, sm_count, page_size, dtype, kv_format, splits, json } => {
            let r = kv_format.parse::<KvFormatKind>().and_then(|kv_format| {
                let shape = MlaShape { batches: &batch, heads, s_q, seq_len, sm_count, page_size, splits, kv_format };
                mla_plan(graphsafe::arch::plan_mla(&arch)?, &shape, &dtype, json)
            });
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
    s_q: i64,
    seq_len: i64,
    sm_count: i64,
    page_size: i64,
    splits: Option<i64>,
    kv_format: KvFormatKind,
}

/// A flag's value as the planners' u32 (an out-of-range value is refused by name, as the flag).
fn flag_u32(flag: &str, v: i64) -> graphsafe::Result<u32> {
    u32::try_from(v).map_err(|_| graphsafe::Error::invalid(flag, "a value in 0..2^32", v))
}

/// A planner's refusal named by the flag that carries the value.
fn name_by_flags(e: graphsafe::Error) -> graphsafe::Error {
    match e {
        graphsafe::Error::InvalidArgument { what, expected, got } => {
            let what = match what.as_str() {
                "num_heads" => "--heads",
                "s_q" => "--s-q",
                "num_heads, s_q" => "--heads, --s-q",
                "batch x s_q" | "batch x s_q x page-table columns" => "--batch x --s-q",
                "batch" | "max_batch" => "--batch",
                "max_seq_len" => "--seq-len",
                "sm_count" => "--sm-count",
                "page_size" => "--page-size",
                "dtype" => "--dtype",
                "kv_format" => "--kv-format",
                "num_splits" => "--splits",
                _ => what.as_str(),
            }
            .to_string();
            graphsafe::Error::InvalidArgument { what, expected, got }
        }
        other => other,
    }
}

/// `plan mla` on either back-end, through the planners' one front door (`mla::plan`,
/// `mla::worst_case`): every rule is theirs, refusals name the flag.
fn mla_plan(arch: MlaArch, a: &MlaShape, dtype: &str, json: bool) -> graphsafe::Result<()> {
    let dtype: KvDtype = dtype.parse()?;
    let splits = a.splits.map(|n| flag_u32("--splits", n)).transpose()?;
    let limits = |batch: i64| -> graphsafe::Result<MlaLimits> {
        Ok(MlaLimits::new(flag_u32("--heads", a.heads)?, flag_u32("--batch", batch)?, flag_u32("--seq-len", a.seq_len)?, flag_u32("--sm-count", a.sm_count)?)
            .with_dtype(dtype)
            .with_kv_format(a.kv_format)
            .with_s_q(flag_u32("--s-q", a.s_q)?)
            .with_page_size(flag_u32("--page-size", a.page_size)?)
            .with_num_splits(splits))
    };
    let plans = a.batches.iter().map(|&b| mla::plan(arch, &limits(b)?).map_err(name_by_flags)).collect::<graphsafe::Result<Vec<MlaDecodePlan>>>()?;
    let max_batch = *a.batches.iter().max().expect("clap requires at least one batch");
    // The same split request as the rows: an engine that captures with --splits needs that much.
    let worst = mla::worst_case(arch, &limits(max_batch)?).map_err(name_by_flags)?;
    let pre = PreGrow::new(worst.workspace_bytes, a, max_batch, (worst.batch, worst.max_seq_len, worst.num_splits));
    let kernel = match arch {
        MlaArch::Sm100 => "cutlass-4.2-sm100",
        MlaArch::Sm90 => "graphsafe-sm90",
    };
    if json {
        println!("{}", pre.json(kernel, dtype, a, serde_json::json!(plans)));
        return Ok(());
    }
    let (seq_len, sm_count) = (a.seq_len, a.sm_count);
    match arch {
        MlaArch::Sm100 => {
            // CUTLASS runs one token of 128 heads a request: graphsafe pads and expands the rest.
            let heads = if a.heads != 128 { format!(", {} heads (padded to 128)", a.heads) } else { String::new() };
            let tokens = if a.s_q > 1 { format!(", {0} query tokens a request (run as {0} requests)", a.s_q) } else { String::new() };
            println!("MLA decode plan: CUTLASS 4.2 sm100 kernel, {dtype}, {} KV cache{heads}{tokens}, max seq len {seq_len}, page size {}, {sm_count} SMs", a.kv_format, a.page_size);
            println!("{:>8} {:>7} {:>11} {:>16}", "batch", "splits", "scheduler", "workspace bytes");
            for p in &plans {
                let sched = match sm100::scheduler(p.num_splits)? {
                    sm100::Scheduler::Persistent => "persistent",
                    sm100::Scheduler::Individual => "individual",
                };
                println!("{:>8} {:>7} {:>11} {:>16}", p.batch, p.num_splits, sched, p.workspace_bytes);
            }
        }
        MlaArch::Sm90 => {
            let tokens = if a.s_q > 1 { format!(", {} query tokens a request", a.s_q) } else { String::new() };
            println!("MLA decode plan: graphsafe sm90 kernel, {dtype}, {} KV cache, {} heads{tokens}, max seq len {seq_len}, {sm_count} SMs", a.kv_format, a.heads);
            println!("{:>8} {:>7} {:>16}", "batch", "splits", "workspace bytes");
            for p in &plans {
                println!("{:>8} {:>7} {:>16}", p.batch, p.num_splits, p.workspace_bytes);
            }
        }
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
    println!("{:>8} {:>34} {:>16} {:>16}", "m", "tile (cluster) / schedule", "workspace bytes", "prepared weight");
    for p in &plans {
        let tile = match (p.tile, p.schedule) {
            (Some(t), _) => format!("{}x{}x{} ({}x{})", t.m, t.n, t.k, t.cluster_m, t.cluster_n),
            // Hopper: the weight-only kernel's tile is 128 weight rows x rows_per_cta activation rows.
            (None, Some(s)) if s.stream_k => format!("{}-row stream-K, {} CTAs{}", s.rows_per_cta, s.ctas, if p.workspace_bytes > 0 { " +fixup" } else { "" }),
            (None, Some(s)) if s.splits == 1 => format!("{}-row tiles, {} CTAs", s.rows_per_cta, s.ctas),
            (None, Some(s)) => format!("{}-row tiles x {} splits, {} CTAs", s.rows_per_cta, s.splits, s.ctas),
            (None, None) => "-".to_string(),
        };
        let prep = p.prepared_weight_bytes.map_or("-".to_string(), |b| b.to_string());
        println!("{:>8} {:>34} {:>16} {:>16}", p.m, tile, p.workspace_bytes, prep);
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
            "kv_format": a.kv_format,
            "heads": a.heads,
            "s_q": a.s_q,
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
