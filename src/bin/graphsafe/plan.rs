//! `graphsafe plan …`: both ops plan through the library's front doors (`mla::plan` and
//! `mla::worst_case`, `nvfp4::plan` and `nvfp4::worst_case`), so every rule is the library's; this
//! file turns flags into their arguments and their refusals back into flags.

use clap::Subcommand;
use graphsafe::arch::{Gpu, Op, Target};
use graphsafe::ops::mla::{self as mla, sm100, KvFormatKind, MlaArch, MlaDecodePlan, MlaLimits};
use graphsafe::ops::nvfp4::{self, Nvfp4Limits, Nvfp4Plan};
use graphsafe::ops::tensor::DType;
use graphsafe::Error;

/// The rows of the arch table with a kernel for `op`.
fn rows_of(op: Op) -> impl Iterator<Item = &'static Target> {
    graphsafe::arch::TARGETS.iter().filter(move |t| op.runs_on(t))
}

/// `--arch`'s help for `op`, from the arch table (so that a new row is listed without editing
/// this file): each row with a kernel for it, the compute capabilities it runs on and the GPUs
/// known by name there.
fn arch_help(op: Op) -> String {
    let rows: Vec<String> = rows_of(op)
        .map(|t| {
            let ccs: Vec<String> = t.runs_on.iter().map(|&cc| graphsafe::arch::cc_name(cc)).collect();
            let gpus: Vec<&str> = graphsafe::arch::GPUS.iter().filter(|g| t.runs_on.contains(&g.compute_capability)).map(|g| g.name).collect();
            let gpus = if gpus.is_empty() { String::new() } else { format!(": {}", gpus.join(", ")) };
            format!("{} ({}{gpus})", t.name, ccs.join(", "))
        })
        .collect();
    format!(
        "Target with a kernel for {}: a row of the arch table, a compute capability it runs on, or a GPU by name (its SM count is \
         then the default): {}",
        op.label(),
        rows.join("; ")
    )
}

/// `--sm-count`'s help for `op`: the SM count each row's reference GPU gives when neither this
/// flag nor a GPU by name in `--arch` says.
fn sm_count_help(op: Op, range: &str) -> String {
    let refs: Vec<String> = rows_of(op).map(|t| format!("{} {}", t.reference_gpu, t.sm_count)).collect();
    format!("SMs of the target GPU{range} (default: the GPU --arch names, else the row's reference GPU: {})", refs.join(", "))
}

#[derive(Subcommand)]
pub enum PlanOp {
    /// NVFP4 GEMM D[M,N] = A[M,K]·W[N,K]ᵀ: tile and workspace per M (Blackwell: CUTLASS block-scaled;
    /// Hopper: the weight-only kernel's schedule, with the prepared weight's size), and the pre-grow
    /// maximum over every M.
    Nvfp4 {
        /// Rows of A: every batch size captured, comma separated (e.g. 1,16,256,4096).
        #[arg(long, value_delimiter = ',', required = true, allow_negative_numbers = true)]
        m: Vec<i64>,
        /// Rows of W (output features), a multiple of 32.
        #[arg(long, allow_negative_numbers = true)]
        n: i64,
        /// Reduction length, a multiple of 32.
        #[arg(long, allow_negative_numbers = true)]
        k: i64,
        #[arg(long, default_value = graphsafe::arch::PLAN_DEFAULT, help = arch_help(Op::Nvfp4))]
        arch: String,
        /// Output dtype: bf16 or fp16 (sm_90: bf16).
        #[arg(long, default_value = "bf16")]
        out: String,
        #[arg(long = "sm-count", allow_negative_numbers = true, help = sm_count_help(Op::Nvfp4, ""))]
        sm_count: Option<i64>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// MLA decode: splits and workspace per batch, and the pre-grow maximum.
    Mla {
        #[arg(long, default_value = graphsafe::arch::PLAN_DEFAULT, help = arch_help(Op::Mla))]
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
        #[arg(long = "sm-count", allow_negative_numbers = true, help = sm_count_help(Op::Mla, ", 1..=1024"))]
        sm_count: Option<i64>,
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
    let r = match op {
        PlanOp::Nvfp4 { m, n, k, arch, out, sm_count, json } => {
            let a = Nvfp4Args { ms: &m, n, k, out: &out, sm_count };
            nvfp4_plan(&arch, &a, json).map_err(|e| name_by_flags(e, NVFP4_FLAGS))
        }
        PlanOp::Mla { arch, heads, s_q, batch, seq_len, sm_count, page_size, dtype, kv_format, splits, json } => {
            let shape = MlaShape { batches: &batch, heads, s_q, seq_len, sm_count, page_size, splits, dtype: &dtype, kv_format: &kv_format };
            mla_plan(&arch, &shape, json).map_err(|e| name_by_flags(e, MLA_FLAGS))
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => crate::usage_error(&e),
    }
}

/// An internal name a planner's refusal may use, the flag that carries it, and whether the name
/// is also replaced inside the refusal's text (names with `_` or `.` are never prose; short
/// words like `m` or `batch` are, so only the refused argument's own name is replaced).
type FlagName = (&'static str, &'static str, bool);

const MLA_FLAGS: &[FlagName] = &[
    ("num_heads", "--heads", true),
    ("s_q", "--s-q", true),
    ("batch", "--batch", false),
    ("max_batch", "--batch", true),
    ("max_seq_len", "--seq-len", true),
    ("sm_count", "--sm-count", true),
    ("page_size", "--page-size", true),
    ("dtype", "--dtype", true),
    ("kv_format", "--kv-format", true),
    ("num_splits", "--splits", true),
    ("arch", "--arch", false),
];

const NVFP4_FLAGS: &[FlagName] = &[
    ("m", "--m", false),
    ("n", "--n", false),
    ("k", "--k", false),
    ("sm_count", "--sm-count", true),
    ("out", "--out", false),
    ("d.dtype", "--out", true),
    ("arch", "--arch", false),
];

/// `text` with each whole word (letters, digits, `_`, `.`, `-`; a sentence's final `.` aside)
/// that `names` lists replaced by its flag: all of them (`what`), or only those marked for prose.
/// (`-` belongs to words so that a flag already in the text, `--batch`, stays as it is.)
fn rewrite(text: &str, names: &[FlagName], prose: bool) -> String {
    let flag = |word: &str| names.iter().find(|(n, _, p)| *n == word && (*p || !prose)).map(|(_, f, _)| *f);
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars().map(Some).chain([None]) {
        if let Some(c) = c.filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
            word.push(c);
            continue;
        }
        let stem = word.trim_end_matches('.');
        match flag(stem) {
            Some(f) => {
                out.push_str(f);
                out.push_str(&word[stem.len()..]);
            }
            None => out.push_str(&word),
        }
        word.clear();
        out.extend(c);
    }
    out
}

/// A planner's refusal named by the flags that carry its values, never by the library's fields.
fn name_by_flags(e: Error, names: &[FlagName]) -> Error {
    match e {
        Error::InvalidArgument { what, expected, got } => Error::InvalidArgument { what: rewrite(&what, names, false), expected: rewrite(&expected, names, true), got },
        other => other,
    }
}

/// A flag's value as the planners' u32 (an out-of-range value is refused by name, as the flag).
fn flag_u32(flag: &str, v: i64) -> graphsafe::Result<u32> {
    u32::try_from(v).map_err(|_| Error::invalid(flag, "a value in 0..2^32", v))
}

/// What `--arch` names: a row of the arch table (by any name `arch::parse_target` takes), or a GPU
/// by name (`arch::gpu_named`), whose row is the one its compute capability runs.
struct Arch {
    target: &'static Target,
    gpu: Option<&'static Gpu>,
}

impl Arch {
    /// `--arch`, and its back-end for an op (`back_end`: the library's planning lookup of a row);
    /// refused naming every target the op has, and the GPU names.
    fn parse<B>(arg: &str, back_end: impl Fn(&str) -> graphsafe::Result<B>) -> graphsafe::Result<(Arch, B)> {
        let arch = graphsafe::arch::parse_target(arg).map(|target| Arch { target, gpu: None }).or_else(|| {
            let gpu = graphsafe::arch::gpu_named(arg)?;
            Some(Arch { target: graphsafe::arch::target_for_cc(gpu.compute_capability)?, gpu: Some(gpu) })
        });
        let refused = |e: Error, got: String| match e {
            Error::InvalidArgument { expected, .. } => Error::invalid("--arch", format!("{expected}; or a GPU by name: {}", graphsafe::arch::gpu_names()), got),
            e => e,
        };
        match arch {
            Some(a) => match back_end(a.target.name) {
                Ok(b) => Ok((a, b)),
                Err(e) => {
                    let got = a.gpu.map_or(arg.to_string(), |g| format!("{arg} ({})", graphsafe::arch::cc_name(g.compute_capability)));
                    Err(refused(e, got))
                }
            },
            None => Err(refused(back_end(arg).err().unwrap_or_else(|| Error::invalid("arch", "a target", arg)), arg.to_string())),
        }
    }

    /// The SM count to plan for: `--sm-count`, else the GPU `--arch` named, else the row's
    /// reference GPU; and where it came from (`"--sm-count"` or the GPU's name).
    fn sm_count(&self, flag: Option<i64>) -> (i64, &'static str) {
        match (flag, self.gpu) {
            (Some(n), _) => (n, "--sm-count"),
            (None, Some(g)) => (g.sm_count.into(), g.name),
            (None, None) => (self.target.sm_count.into(), self.target.reference_gpu),
        }
    }

    /// How a table's heading says where the SM count came from.
    fn sm_note(&self, from: &str) -> String {
        match (from, self.gpu) {
            ("--sm-count", _) => String::new(),
            (gpu, Some(_)) => format!(" ({gpu}'s; --sm-count to change)"),
            (gpu, None) => format!(" ({gpu}'s, the reference GPU of {}; --sm-count to change)", self.target.name),
        }
    }

    /// The fields every `--json` document has about the target.
    fn json(&self, back_end: &str, sm_count: i64, from: &str) -> serde_json::Value {
        serde_json::json!({
            "schema_version": crate::JSON_SCHEMA_VERSION,
            "arch": back_end,
            "target": self.target.name,
            "gpu": self.gpu.map(|g| g.name),
            "sm_count": sm_count,
            "sm_count_from": from,
        })
    }
}

/// `{"min": 1, "max": max}`: a range of values the pre-grow covers, as numbers.
fn range(max: i64) -> serde_json::Value {
    serde_json::json!({ "min": 1, "max": max })
}

/// Adds `fields` to the object `doc`.
fn extend(mut doc: serde_json::Value, fields: serde_json::Value) -> serde_json::Value {
    if let (Some(d), serde_json::Value::Object(f)) = (doc.as_object_mut(), fields) {
        d.extend(f);
    }
    doc
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("plain JSON values serialize"));
}

/// What `plan mla` was asked for.
struct MlaShape<'a> {
    batches: &'a [i64],
    heads: i64,
    s_q: i64,
    seq_len: i64,
    sm_count: Option<i64>,
    page_size: i64,
    splits: Option<i64>,
    dtype: &'a str,
    kv_format: &'a str,
}

/// `plan mla` on either back-end, through the planners' one front door (`mla::plan` for each
/// batch, `mla::worst_case` for the pre-grow).
fn mla_plan(arch_arg: &str, a: &MlaShape, json: bool) -> graphsafe::Result<()> {
    let (arch, back_end) = Arch::parse(arch_arg, graphsafe::arch::plan_mla)?;
    let kv_format: KvFormatKind = a.kv_format.parse()?;
    let dtype: DType = a.dtype.parse()?;
    let (sm_count, sm_from) = arch.sm_count(a.sm_count);
    let splits = a.splits.map(|n| flag_u32("--splits", n)).transpose()?;
    let limits = |batch: i64| -> graphsafe::Result<MlaLimits> {
        Ok(MlaLimits::new(flag_u32("--heads", a.heads)?, flag_u32("--batch", batch)?, flag_u32("--seq-len", a.seq_len)?, flag_u32("--sm-count", sm_count)?)
            .with_dtype(dtype)
            .with_kv_format(kv_format)
            .with_s_q(flag_u32("--s-q", a.s_q)?)
            .with_page_size(flag_u32("--page-size", a.page_size)?)
            .with_num_splits(splits))
    };
    let plans = a.batches.iter().map(|&b| mla::plan(back_end, &limits(b)?)).collect::<graphsafe::Result<Vec<MlaDecodePlan>>>()?;
    let max_batch = *a.batches.iter().max().expect("clap requires at least one batch");
    // The same split request as the rows: an engine that captures with --splits needs that much.
    let worst = mla::worst_case(back_end, &limits(max_batch)?)?;
    let kernel = match back_end {
        MlaArch::Sm100 => "cutlass-4.2-sm100",
        MlaArch::Sm90 => "graphsafe-sm90",
    };
    if json {
        let doc = serde_json::json!({
            "op": "mla",
            "kernel": kernel,
            "dtype": dtype,
            "kv_format": kv_format,
            "heads": a.heads,
            "s_q": a.s_q,
            "seq_len": a.seq_len,
            "page_size": a.page_size,
            "splits": a.splits,
            "plans": plans,
            // The worst case covers every row: each row is a shape of its domain (batch up to the
            // largest listed, the longest length, tokens up to --s-q), planned with the same
            // split request.
            "pre_grow": {
                "workspace_bytes": worst.workspace_bytes,
                "over_batches": range(max_batch),
                "over_seq_lens": range(a.seq_len),
                "over_s_q": range(a.s_q),
                "num_splits": a.splits,
                "worst_batch": worst.batch,
                "worst_seq_len": worst.max_seq_len,
                "worst_s_q": worst.s_q,
                "worst_num_splits": worst.num_splits,
            }
        });
        print_json(&extend(arch.json(back_end.name(), sm_count, sm_from), doc));
        return Ok(());
    }
    let (seq_len, sms) = (a.seq_len, format!("{sm_count} SMs{}", arch.sm_note(sm_from)));
    match back_end {
        MlaArch::Sm100 => {
            // CUTLASS runs one token of 128 heads a request: graphsafe pads and expands the rest.
            let heads = if a.heads != 128 { format!(", {} heads (padded to 128)", a.heads) } else { String::new() };
            let tokens = if a.s_q > 1 { format!(", {0} query tokens a request (run as {0} requests)", a.s_q) } else { String::new() };
            println!("MLA decode plan: CUTLASS 4.2 sm100 kernel, {dtype}, {kv_format} KV cache{heads}{tokens}, max seq len {seq_len}, page size {}, {sms}", a.page_size);
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
            println!("MLA decode plan: graphsafe sm90 kernel, {dtype}, {kv_format} KV cache, {} heads{tokens}, max seq len {seq_len}, {sms}", a.heads);
            println!("{:>8} {:>7} {:>16}", "batch", "splits", "workspace bytes");
            for p in &plans {
                println!("{:>8} {:>7} {:>16}", p.batch, p.num_splits, p.workspace_bytes);
            }
        }
    }
    let rule = a.splits.map_or(String::new(), |n| format!(" with {n} splits"));
    println!(
        "pre-grow before capture: {} bytes (worst case over batch 1..={max_batch} and seq len 1..={seq_len}{rule}: batch {}, seq len {}, {} splits)",
        worst.workspace_bytes, worst.batch, worst.max_seq_len, worst.num_splits
    );
    Ok(())
}

/// What `plan nvfp4` was asked for.
struct Nvfp4Args<'a> {
    ms: &'a [i64],
    n: i64,
    k: i64,
    out: &'a str,
    sm_count: Option<i64>,
}

/// `plan nvfp4`: each M through `nvfp4::plan`, the pre-grow through `nvfp4::worst_case`.
fn nvfp4_plan(arch_arg: &str, a: &Nvfp4Args, json: bool) -> graphsafe::Result<()> {
    let (arch, back_end) = Arch::parse(arch_arg, graphsafe::arch::plan_nvfp4)?;
    let out = match a.out {
        "bf16" => DType::Bf16,
        "fp16" => DType::Fp16,
        other => return Err(Error::invalid("out", "bf16 or fp16", other)),
    };
    let (sms, sm_from) = arch.sm_count(a.sm_count);
    let plans = a.ms.iter().map(|&m| nvfp4::plan(back_end, m, a.n, a.k, out, sms)).collect::<graphsafe::Result<Vec<Nvfp4Plan>>>()?;
    let ms = a.ms.iter().map(|&m| flag_u32("--m", m)).collect::<graphsafe::Result<Vec<u32>>>()?;
    let limits = Nvfp4Limits::new(ms, flag_u32("--n", a.n)?, flag_u32("--k", a.k)?, flag_u32("--sm-count", sms)?).with_out(out);
    let worst = nvfp4::worst_case(back_end, &limits)?;
    if json {
        let doc = serde_json::json!({
            "op": "nvfp4",
            "n": a.n,
            "k": a.k,
            "out": out,
            "plans": plans,
            "pre_grow": {
                "workspace_bytes": worst.workspace_bytes,
                "over_m": limits.m,
                "worst_m": worst.m,
                "prepared_weight_bytes": worst.prepared_weight_bytes,
            }
        });
        print_json(&extend(arch.json(back_end.name(), sms, sm_from), doc));
        return Ok(());
    }
    println!("NVFP4 GEMM plan: {} back-end ({}), N {}, K {}, {sms} SMs{}, {out} out", back_end.name(), arch.target.name, a.n, a.k, arch.sm_note(sm_from));
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
    let prepared = worst.prepared_weight_bytes.map_or(String::new(), |b| format!("; each weight prepared once, outside capture: {b} bytes"));
    let over: Vec<String> = limits.m.iter().map(u32::to_string).collect();
    println!("pre-grow before capture: {} bytes (worst case over m {}: m {}){prepared}", worst.workspace_bytes, over.join(","), worst.m);
    Ok(())
}
