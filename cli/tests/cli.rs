//! The `graphsafe` command line as a user runs it: outputs, JSON, and exit code 2 for bad input.

use std::process::{Command, Output};

/// The binary under test: GRAPHSAFE_BIN when set (test executables carried to another machine,
/// where cargo's build path does not exist), else the one cargo built.
fn graphsafe(args: &[&str]) -> Output {
    let exe = std::env::var("GRAPHSAFE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_graphsafe").to_string());
    Command::new(exe).args(args).output().expect("run graphsafe")
}

#[test]
fn plan_mla_prints_each_batch_and_the_pre_grow_maximum() {
    let out = graphsafe(&["plan", "mla", "--batch", "1,8,64,128", "--seq-len", "65536", "--sm-count", "148"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
    assert_eq!(rows.len(), 4, "{text}");
    // CUTLASS's 2052 * 128 * 16 bytes, then the sanitize region (64-token pages, the default):
    // lengths 256 + kernel lengths 256 + page table 4 * 1024 + LSE scratch 512.
    assert!(rows[0].split_whitespace().eq(["1", "16", "individual", "4207616"]), "{text}");
    // One split: the sanitize region alone, 512 + 512 + 4 * 128 * 1024.
    assert!(rows[3].split_whitespace().eq(["128", "1", "persistent", "525312"]), "{text}");
    assert!(text.contains("pre-grow before capture: 4207616 bytes"), "{text}");
}

/// (batch rows' workspace, pre-grow) of a `plan mla --json` run.
fn rows_and_pre_grow(args: &[&str]) -> (Vec<u64>, u64) {
    let out = graphsafe(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["plans"].as_array().unwrap().iter().map(|p| p["workspace_bytes"].as_u64().unwrap()).collect();
    (rows, v["pre_grow"]["workspace_bytes"].as_u64().unwrap())
}

#[test]
fn the_pre_grow_covers_every_row_printed_with_explicit_splits() {
    // Explicit splits beyond the default rule's: 256 splits need 4,303,355,904 bytes at batch 64
    // (fp32 partials), far past the default rule's worst case (45,176,832), so the pre-grow line
    // must cover the splits asked for, not the default's.
    let (rows, pre) = rows_and_pre_grow(&["plan", "mla", "--arch", "sm_90", "--batch", "1,64", "--seq-len", "65536", "--sm-count", "132", "--splits", "256", "--json"]);
    // 64 x 256 x 128 rows, each a 512-value fp32 partial O and an fp32 LSE, then the batch's
    // schedule: 64 lengths and 64 x 256 work items (int32, each region 256-aligned).
    assert_eq!(rows[1], 2_097_152 * 2052 + 256 + 65_536);
    assert!(rows.iter().all(|&r| r <= pre), "{rows:?} > {pre}");
    assert_eq!(pre, rows[1]);
    let (rows, pre) = rows_and_pre_grow(&["plan", "mla", "--batch", "1", "--seq-len", "65536", "--sm-count", "148", "--splits", "3", "--json"]);
    assert!(rows.iter().all(|&r| r <= pre), "{rows:?} > {pre}");
    let (rows, pre) = rows_and_pre_grow(&["plan", "mla", "--batch", "1,7,300", "--seq-len", "9999", "--sm-count", "148", "--page-size", "16", "--splits", "1", "--json"]);
    assert!(rows.iter().all(|&r| r <= pre) && pre == rows[2], "{rows:?} > {pre}");
}

#[test]
fn the_largest_accepted_plans_answer_and_larger_ones_are_refused_naming_the_limit() {
    // Bounded planners: these used to scan batch x tiles for up to an hour.
    for args in [
        &["plan", "mla", "--batch", "65535", "--seq-len", "4194176", "--sm-count", "148", "--page-size", "128"][..],
        &["plan", "mla", "--batch", "128", "--seq-len", "2147483520", "--sm-count", "148", "--page-size", "128"],
        &["plan", "mla", "--arch", "sm_90", "--heads", "16", "--batch", "65535", "--seq-len", "2147483520", "--sm-count", "1024"],
    ] {
        let out = graphsafe(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    for (args, needle) in [
        (&["plan", "mla", "--batch", "2147483647", "--seq-len", "4096", "--sm-count", "148"][..], "65535"),
        (&["plan", "mla", "--arch", "sm_90", "--batch", "1", "--seq-len", "2147483647", "--sm-count", "132"], "2147483520"),
        (&["plan", "mla", "--batch", "129", "--seq-len", "2147483520", "--sm-count", "148", "--page-size", "128"], "page-table columns"),
        (&["plan", "mla", "--batch", "1", "--seq-len", "4096", "--sm-count", "4096"], "1024"),
    ] {
        let out = graphsafe(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains(needle) && err.trim_end().lines().count() == 1, "{args:?}: {err}");
    }
}

#[test]
fn plan_mla_json_is_machine_readable() {
    let out = graphsafe(&["plan", "mla", "--batch", "1,2", "--seq-len", "1000", "--sm-count", "20", "--dtype", "fp8", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dtype"], "fp8_e4m3");
    assert_eq!(v["plans"][0]["num_splits"], 8);
    // CUTLASS's part, then lengths, kernel lengths, 8 tiles x 2 pages of page table, LSE scratch.
    assert_eq!(v["plans"][0]["workspace_bytes"], 2052 * 128 * 8 + 256 + 256 + 256 + 512);
    assert_eq!(v["plans"][1]["num_splits"], 1);
    assert_eq!(v["plans"][1]["workspace_bytes"], 256 + 256 + 256);
    assert_eq!(v["page_size"], 64);
    assert_eq!(v["pre_grow"]["workspace_bytes"], 2052 * 128 * 8 + 256 + 256 + 256 + 512);
}

#[test]
fn plan_mla_for_blackwell_pads_heads_and_expands_tokens() {
    // 16 heads (TP 8), 2 tokens (MTP): CUTLASS runs batch x 2 requests of 128 heads, one split
    // each (more than one request), over staging in the workspace.
    let args = ["plan", "mla", "--arch", "sm_100", "--heads", "16", "--s-q", "2", "--batch", "1,64", "--seq-len", "1000", "--sm-count", "148", "--json"];
    let out = graphsafe(&args);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["heads"].as_u64(), v["s_q"].as_u64()), (Some(16), Some(2)));
    // Lengths, kernel lengths, 8 tiles x 2 pages of page table per kernel request, LSE staging
    // [B', 128] f32, q staging [B', 128, 576] bf16, out staging [B', 128, 512] bf16; 256-aligned.
    let bytes = |kb: u64| 2 * (4 * kb).div_ceil(256) * 256 + (4 * kb * 16).div_ceil(256) * 256 + 512 * kb + 128 * 576 * 2 * kb + 128 * 512 * 2 * kb;
    assert_eq!(v["plans"][0]["num_splits"], 1);
    assert_eq!(v["plans"][0]["workspace_bytes"], bytes(2));
    assert_eq!(v["plans"][1]["workspace_bytes"], bytes(128));
    assert_eq!(v["pre_grow"]["workspace_bytes"], bytes(128));
    assert_eq!(v["pre_grow"]["worst_batch"], 64);
    let text = String::from_utf8(graphsafe(&args[..args.len() - 1]).stdout).unwrap();
    assert!(text.contains("16 heads (padded to 128), 2 query tokens a request (run as 2 requests)"), "{text}");
}

#[test]
fn plan_mla_for_hopper_uses_graphsafes_kernel() {
    let out = graphsafe(&["plan", "mla", "--arch", "sm_90", "--heads", "16", "--batch", "1,64", "--seq-len", "4096", "--sm-count", "132", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kernel"], "graphsafe-sm90");
    let p = graphsafe::ops::mla::sm90::plan(graphsafe::ops::tensor::DType::Bf16, 16, 1, 1, 4096, 132, None).unwrap();
    assert_eq!(v["plans"][0]["num_splits"], p.num_splits);
    assert_eq!(v["plans"][0]["workspace_bytes"], p.workspace_bytes);
    let text = String::from_utf8(graphsafe(&["plan", "mla", "--arch", "sm_90", "--batch", "8", "--seq-len", "65536", "--sm-count", "132"]).stdout).unwrap();
    assert!(text.contains("graphsafe sm90 kernel") && text.contains("pre-grow before capture"), "{text}");
}

#[test]
fn plan_mla_with_an_fp8_kv_cache_has_the_bf16_plans_and_says_its_format() {
    let base = ["plan", "mla", "--arch", "sm_90", "--batch", "1,8,64", "--seq-len", "65536", "--sm-count", "132", "--json"];
    let json = |extra: &[&str]| -> serde_json::Value {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = graphsafe(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    for heads in ["16", "32"] {
        let native = json(&["--heads", heads]);
        assert_eq!(native["kv_format"], "native", "the default");
        for (flag, name) in [("fp8", "fp8_per_tensor"), ("fp8-ds-mla", "fp8_ds_mla")] {
            let v = json(&["--heads", heads, "--kv-format", flag]);
            assert_eq!(v["kv_format"], name);
            let sizes = |v: &serde_json::Value| -> Vec<(u64, u64)> {
                v["plans"].as_array().unwrap().iter().map(|p| (p["num_splits"].as_u64().unwrap(), p["workspace_bytes"].as_u64().unwrap())).collect()
            };
            assert_eq!(sizes(&v), sizes(&native), "{heads} heads, {flag}: the workspace does not depend on the format");
            assert!(v["plans"].as_array().unwrap().iter().all(|p| p["kv_format"] == name), "{heads} heads, {flag}: each row names its format");
            assert_eq!(v["pre_grow"], native["pre_grow"], "{heads} heads, {flag}");
        }
    }
    let text = String::from_utf8(graphsafe(&["plan", "mla", "--arch", "sm_90", "--heads", "32", "--kv-format", "fp8-ds-mla", "--batch", "4", "--seq-len", "4096", "--sm-count", "132"]).stdout).unwrap();
    assert!(text.contains("fp8-ds-mla KV cache") && text.contains("pre-grow before capture"), "{text}");
    let text = String::from_utf8(graphsafe(&["plan", "mla", "--batch", "4", "--seq-len", "4096", "--sm-count", "148"]).stdout).unwrap();
    assert!(text.contains("native KV cache"), "{text}");
}

#[test]
fn plan_mla_refuses_an_fp8_kv_cache_where_the_decode_does_with_its_message() {
    for (args, needles) in [
        // The op's rule: sm_90 only, bf16 queries.
        (&["--arch", "sm_90", "--heads", "16", "--kv-format", "fp8", "--dtype", "fp16"][..], &["`--dtype`", "bf16 with --kv-format fp8"][..]),
        (&["--arch", "sm_90", "--heads", "128", "--kv-format", "fp8-ds-mla", "--dtype", "fp16"], &["`--dtype`", "bf16 with --kv-format fp8-ds-mla"]),
        (&["--arch", "sm_100", "--kv-format", "fp8"], &["`--kv-format`", "sm_100", "--dtype fp8"]),
        (&["--arch", "sm_103", "--kv-format", "fp8-ds-mla", "--dtype", "fp8"], &["`--kv-format`", "sm_100"]),
        (&["--arch", "sm_90", "--heads", "16", "--kv-format", "fp4"], &["`--kv-format`", "native, fp8 or fp8-ds-mla"]),
    ] {
        let all: Vec<&str> = ["plan", "mla", "--batch", "1", "--seq-len", "4096", "--sm-count", "132"].iter().chain(args).copied().collect();
        let out = graphsafe(&all);
        assert_eq!(out.status.code(), Some(2), "{all:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{all:?}: {err}");
        assert!(err.starts_with("error") && needles.iter().all(|n| err.contains(n)), "{all:?}: {err}");
    }
}

#[test]
fn plan_nvfp4_prints_the_tile_per_m() {
    let out = graphsafe(&["plan", "nvfp4", "--m", "1,17,4096", "--n", "8192", "--k", "8192", "--arch", "sm_100", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tiles: Vec<(u64, u64, u64)> = v["plans"].as_array().unwrap().iter().map(|p| (p["tile"]["m"].as_u64().unwrap(), p["tile"]["n"].as_u64().unwrap(), p["tile"]["cluster_m"].as_u64().unwrap())).collect();
    assert_eq!(tiles, vec![(128, 128, 1), (256, 128, 2), (256, 256, 2)]);
    // Hopper: the weight-only kernel's schedule per m (split-K over 8 and 6 ways at m 1 and 16,
    // stream-K at m 1 on the larger weight, 256-row tiles split 2 ways at m 256), in text and JSON.
    let text = String::from_utf8(graphsafe(&["plan", "nvfp4", "--m", "1,16,256", "--n", "8192", "--k", "8192", "--arch", "sm_90"]).stdout).unwrap();
    for row in ["8-row tiles x 8 splits, 512 CTAs", "16-row tiles x 6 splits, 384 CTAs", "256-row tiles x 2 splits, 128 CTAs"] {
        assert!(text.contains(row), "{row}: {text}");
    }
    let text = String::from_utf8(graphsafe(&["plan", "nvfp4", "--m", "1", "--n", "28672", "--k", "8192", "--arch", "sm_90"]).stdout).unwrap();
    assert!(text.contains("8-row stream-K, 528 CTAs +fixup"), "{text}");
    let out = graphsafe(&["plan", "nvfp4", "--m", "256", "--n", "8192", "--k", "8192", "--arch", "sm_90", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["plans"][0]["schedule"];
    assert_eq!((s["rows_per_cta"].as_u64(), s["splits"].as_u64(), s["stream_k"].as_bool()), (Some(256), Some(2), Some(false)), "{v}");
    // The arch table's names: a family row, the GPUs it adds (B300, DGX Spark), the old spelling.
    for (arch, back_end, sms) in [("sm_100f", "sm100", 148), ("sm_103", "sm100", 148), ("sm_100a", "sm100", 148), ("sm_121", "sm120", 170), ("sm_120f", "sm120", 170), ("sm_90a", "sm90", 132)] {
        let out = graphsafe(&["plan", "nvfp4", "--m", "1", "--n", "8192", "--k", "8192", "--arch", arch, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{arch}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((v["arch"].as_str(), v["sm_count"].as_u64()), (Some(back_end), Some(sms)), "{arch}");
    }
    let (b300, _) = rows_and_pre_grow(&["plan", "mla", "--arch", "sm_103", "--batch", "1,64", "--seq-len", "65536", "--sm-count", "148", "--json"]);
    let (b200, _) = rows_and_pre_grow(&["plan", "mla", "--arch", "sm_100", "--batch", "1,64", "--seq-len", "65536", "--sm-count", "148", "--json"]);
    assert_eq!(b300, b200, "B300 runs B200's CUTLASS kernel (sm_100f)");
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    // A GPU no row of the arch table runs on, and one whose row has no MLA kernel, from the table:
    // a literal one stops being refused the day its row or back-end is added.
    let no_row = graphsafe::arch::cc_name(graphsafe::arch::cc_without_row());
    let no_mla = graphsafe::arch::cc_name(graphsafe::arch::cc_without(graphsafe::arch::Op::Mla));
    let cases: &[&[&str]] = &[
        &["plan", "mla", "--batch", "0", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--batch", "-4", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--batch", "1", "--seq-len", "0", "--sm-count", "10"],
        &["plan", "mla", "--batch", "1", "--seq-len", "10", "--sm-count", "-1"],
        &["plan", "mla", "--batch", "x", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--batch", "1", "--seq-len", "ten", "--sm-count", "10"],
        &["plan", "mla", "--batch", "1", "--seq-len", "10", "--sm-count", "10", "--dtype", "fp32"],
        &["plan", "mla", "--batch", "2", "--seq-len", "10000", "--sm-count", "148", "--splits", "4"],
        &["plan", "mla", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "attention"],
        &["plan", "nvfp4", "--m", "1", "--n", "8192", "--k", "48"],
        &["plan", "nvfp4", "--m", "0", "--n", "8192", "--k", "64"],
        &["plan", "nvfp4", "--m", "1", "--n", "8192", "--k", "64", "--arch", &no_row],
        &["plan", "mla", "--arch", &no_row, "--batch", "1", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--arch", &no_mla, "--batch", "1", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--arch", "sm_90", "--heads", "129", "--batch", "1", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--arch", "sm_90", "--heads", "16", "--s-q", "17", "--batch", "1", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--arch", "sm_90", "--heads", "16", "--s-q", "0", "--batch", "1", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--arch", "sm_100", "--s-q", "17", "--batch", "1", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--arch", "sm_100", "--heads", "0", "--batch", "1", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--arch", "sm_100", "--heads", "16", "--s-q", "2", "--batch", "32768", "--seq-len", "10", "--sm-count", "10"],
        &["plan", "mla", "--batch", "1", "--seq-len", "10", "--sm-count", "10", "--page-size", "48"],
        &["plan", "mla", "--arch", "sm_90", "--heads", "16", "--batch", "1", "--seq-len", "10", "--sm-count", "10", "--page-size", "16"],
        &["plan", "mla", "--batch", "65536", "--seq-len", "10", "--sm-count", "10"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = graphsafe(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error"), "{args:?}: {err}");
    }
}

#[test]
fn doctor_reports_the_build_and_a_missing_driver_is_a_normal_answer() {
    let out = graphsafe(&["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let archs: Vec<String> = serde_json::from_value(v["kernel_archs"].clone()).unwrap();
    assert_eq!(archs, graphsafe::build_info::archs());
    assert!(v["cuda_toolkit"]["version"].as_str().unwrap().starts_with("1"));
    assert_eq!(v["cutlass"]["version"], "4.2.0");
    let present = v["driver"]["present"].as_bool().unwrap();
    assert_eq!(present, graphsafe::driver::driver_version().is_ok());
}

#[test]
fn demo_runs_and_names_its_target() {
    let out = graphsafe(&["demo"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("workspace plan for"), "{text}");
    assert!(text.contains("pre-grow the workspace to"), "{text}");
}

/// The one line of a refused run (exit 2): its stderr, checked to be a single line.
fn refusal(args: &[&str]) -> String {
    let out = graphsafe(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("error"), "{args:?}: {err}");
    err
}

#[test]
fn a_missing_argument_is_named_in_the_one_line() {
    let err = refusal(&["plan", "mla", "--seq-len", "10"]);
    assert!(err.contains("required arguments were not provided") && err.contains("--batch <BATCH>"), "{err}");
    let err = refusal(&["plan", "nvfp4", "--m", "1"]);
    assert!(err.contains("--n <N>") && err.contains("--k <K>"), "{err}");
    let err = refusal(&["plan", "mla", "--batch", "1"]);
    assert!(err.contains("--seq-len <SEQ_LEN>") && !err.contains("--batch"), "{err}");
    // clap's tip comes along too.
    let err = refusal(&["plan", "nvfp4", "--m", "1", "--n", "64", "--k", "64", "--jsn"]);
    assert!(err.contains("'--jsn'") && err.contains("tip:") && err.contains("'--json'"), "{err}");
}

/// Every refusal of a flag's value names the flag, and no internal field of the library
/// (`max_seq_len`, `KvFormat::Native`, `d.dtype`, ...), in its subject or its explanation.
#[test]
fn refusals_name_flags_never_the_librarys_fields() {
    const INTERNAL: &[&str] =
        &["max_seq_len", "num_heads", "s_q", "kv_format", "page_size", "sm_count", "num_splits", "max_batch", "d.dtype", "KvFormat", "`m`", "`n`", "`k`", "`out`", "`arch`", "`batch`", "`dtype`"];
    let mla = |extra: &[&'static str]| -> Vec<&'static str> { ["plan", "mla", "--batch", "1", "--seq-len", "4096"].iter().chain(extra).copied().collect() };
    let nvfp4 = |extra: &[&'static str]| -> Vec<&'static str> { ["plan", "nvfp4", "--m", "1,16", "--n", "8192", "--k", "8192"].iter().chain(extra).copied().collect() };
    // The GPUs refused, from the arch table (leaked to be `'static` like the other cases).
    let no_row: &'static str = graphsafe::arch::cc_name(graphsafe::arch::cc_without_row()).leak();
    let no_mla: &'static str = graphsafe::arch::cc_name(graphsafe::arch::cc_without(graphsafe::arch::Op::Mla)).leak();
    let an_mla_row = graphsafe::arch::TARGETS.iter().find(|t| t.mla().is_some()).unwrap().name;
    let a_gpu_by_name: &'static str = format!("or a GPU by name: {}", graphsafe::arch::GPUS[0].name).leak();
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (mla(&["--heads", "129", "--arch", "sm_90"]), "`--heads`", "1..=128"),
        (mla(&["--heads", "0"]), "`--heads`", "1..=128"),
        (vec!["plan", "mla", "--batch", "40000", "--s-q", "2", "--seq-len", "10"], "`--batch x --s-q`", "each of the --s-q query tokens"),
        (mla(&["--s-q", "17", "--arch", "sm_90", "--heads", "16"]), "`--s-q`", "1..=16"),
        (mla(&["--sm-count", "4096"]), "`--sm-count`", "1..=1024"),
        (mla(&["--page-size", "48"]), "`--page-size`", "power of two"),
        (mla(&["--dtype", "fp32"]), "`--dtype`", "bf16, fp16 or fp8"),
        (mla(&["--arch", "sm_90", "--dtype", "fp8"]), "`--dtype`", "--kv-format"),
        (mla(&["--kv-format", "fp4"]), "`--kv-format`", "native, fp8 or fp8-ds-mla"),
        (mla(&["--kv-format", "fp8"]), "`--kv-format`", "--dtype fp8"),
        (mla(&["--arch", "sm_90", "--heads", "16", "--splits", "900"]), "`--splits`", "1..=64"),
        (vec!["plan", "mla", "--batch", "2", "--seq-len", "10000", "--splits", "4"], "`--splits`", "--seq-len 10000"),
        (vec!["plan", "mla", "--batch", "1", "--seq-len", "2147483647"], "`--seq-len`", "2147483520"),
        (vec!["plan", "mla", "--batch", "65536", "--seq-len", "10"], "`--batch`", "65535"),
        (vec!["plan", "mla", "--batch", "129", "--seq-len", "2147483520", "--page-size", "128"], "`--batch x page-table columns`", "ceil(--seq-len / 128) x 128 / --page-size"),
        (mla(&["--arch", no_mla]), "`--arch`", an_mla_row),
        (mla(&["--arch", "RTX 5090"]), "`--arch`", "or a GPU by name"),
        (nvfp4(&["--arch", "sm_90", "--out", "fp16"]), "`--out`", "bf16"),
        (nvfp4(&["--out", "fp32"]), "`--out`", "bf16 or fp16"),
        (vec!["plan", "nvfp4", "--m", "1", "--n", "8192", "--k", "48"], "`--k`", "multiple of 32"),
        (vec!["plan", "nvfp4", "--m", "1", "--n", "100", "--k", "64"], "`--n`", "multiple of 32"),
        (vec!["plan", "nvfp4", "--m", "1,0", "--n", "8192", "--k", "64"], "`--m`", "1..="),
        (nvfp4(&["--sm-count", "0"]), "`--sm-count`", "1..="),
        (nvfp4(&["--arch", no_row]), "`--arch`", a_gpu_by_name),
        (vec!["plan", "nvfp4", "--m", "1", "--n", "2147483520", "--k", "2147483520"], "`--m x --k (A's scale factors)`", "int32"),
    ];
    for (args, subject, explains) in cases {
        let err = refusal(&args);
        assert!(err.contains(&format!("invalid argument {subject}")), "{args:?}: {err}");
        assert!(err.contains(explains), "{args:?}: {err} does not say {explains:?}");
        for name in INTERNAL {
            assert!(!err.contains(name), "{args:?}: {err} names {name}");
        }
    }
}

/// (the JSON document, exit code 0 asserted) of a run.
fn json(args: &[&str]) -> serde_json::Value {
    let out = graphsafe(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_sm_count_defaults_from_the_arch_for_both_ops() {
    // A row: its reference GPU's; a GPU by name: that GPU's; --sm-count wins.
    for (arch, sms, from) in [("sm_90", 132, "H100"), ("sm_100", 148, "B200"), ("sm_103", 148, "B200"), ("H200", 132, "H200"), ("h100 pcie", 114, "H100 PCIe"), ("B200", 148, "B200")] {
        let v = json(&["plan", "mla", "--arch", arch, "--heads", "128", "--batch", "1,64", "--seq-len", "65536", "--json"]);
        assert_eq!((v["sm_count"].as_u64(), v["sm_count_from"].as_str()), (Some(sms), Some(from)), "{arch}");
        // Planned with that count: the same plans as with the flag given.
        let given = json(&["plan", "mla", "--arch", arch, "--heads", "128", "--batch", "1,64", "--seq-len", "65536", "--sm-count", &sms.to_string(), "--json"]);
        assert_eq!((&v["plans"], &v["pre_grow"]), (&given["plans"], &given["pre_grow"]), "{arch}");
        assert_eq!(given["sm_count_from"], "--sm-count");
    }
    for (arch, sms, from) in [("sm_120", 170, "RTX 5090"), ("RTX 5080", 84, "RTX 5080"), ("DGX Spark", 48, "DGX Spark"), ("sm_90a", 132, "H100")] {
        let v = json(&["plan", "nvfp4", "--m", "1,256", "--n", "8192", "--k", "8192", "--arch", arch, "--json"]);
        assert_eq!((v["sm_count"].as_u64(), v["sm_count_from"].as_str()), (Some(sms), Some(from)), "{arch}");
    }
    let v = json(&["plan", "nvfp4", "--m", "1", "--n", "8192", "--k", "8192", "--arch", "B200", "--sm-count", "100", "--json"]);
    assert_eq!((v["sm_count"].as_u64(), v["sm_count_from"].as_str(), v["target"].as_str(), v["gpu"].as_str()), (Some(100), Some("--sm-count"), Some("sm_100f"), Some("B200")));
    let text = String::from_utf8(graphsafe(&["plan", "mla", "--arch", "H200", "--heads", "16", "--batch", "8", "--seq-len", "4096"]).stdout).unwrap();
    assert!(text.contains("132 SMs (H200's; --sm-count to change)"), "{text}");
}

#[test]
fn json_documents_carry_a_schema_version_the_arch_and_numeric_ranges() {
    let v = json(&["plan", "mla", "--arch", "sm_90", "--heads", "16", "--s-q", "2", "--batch", "1,8,64", "--seq-len", "65536", "--json"]);
    assert_eq!(v["schema_version"], 1);
    assert_eq!((v["arch"].as_str(), v["target"].as_str()), (Some("sm90"), Some("sm_90a")));
    let pre = &v["pre_grow"];
    assert_eq!(pre["over_batches"], serde_json::json!({"min": 1, "max": 64}));
    assert_eq!(pre["over_seq_lens"], serde_json::json!({"min": 1, "max": 65536}));
    assert_eq!(pre["over_s_q"], serde_json::json!({"min": 1, "max": 2}));
    assert!(pre["num_splits"].is_null(), "the default rule: no count, not a string");
    let rows: Vec<u64> = v["plans"].as_array().unwrap().iter().map(|p| p["workspace_bytes"].as_u64().unwrap()).collect();
    assert!(rows.iter().all(|&r| r <= pre["workspace_bytes"].as_u64().unwrap()), "{v}");
    let v = json(&["plan", "mla", "--batch", "1", "--seq-len", "65536", "--splits", "3", "--json"]);
    assert_eq!(v["pre_grow"]["num_splits"], 3);

    // NVFP4: the pre-grow is the largest row's workspace, named by its M. Hopper's stream-K at
    // m 1 on a 28672-row weight needs one (its fixup's partials); larger M need none.
    let v = json(&["plan", "nvfp4", "--m", "256,1,16", "--n", "28672", "--k", "8192", "--arch", "sm_90", "--json"]);
    assert_eq!(v["schema_version"], 1);
    assert_eq!((v["arch"].as_str(), v["target"].as_str()), (Some("sm90"), Some("sm_90a")));
    let rows: Vec<(u64, u64)> = v["plans"].as_array().unwrap().iter().map(|p| (p["m"].as_u64().unwrap(), p["workspace_bytes"].as_u64().unwrap())).collect();
    let (worst_m, most) = rows.iter().copied().max_by_key(|&(_, w)| w).unwrap();
    let pre = &v["pre_grow"];
    assert!(most > 0, "{v}");
    assert_eq!((pre["workspace_bytes"].as_u64(), pre["worst_m"].as_u64()), (Some(most), Some(worst_m)));
    assert_eq!(pre["over_m"], serde_json::json!([256, 1, 16]));
    assert_eq!(pre["prepared_weight_bytes"], v["plans"][0]["prepared_weight_bytes"]);
    let text = String::from_utf8(graphsafe(&["plan", "nvfp4", "--m", "256,1,16", "--n", "28672", "--k", "8192", "--arch", "sm_90"]).stdout).unwrap();
    assert!(text.contains(&format!("pre-grow before capture: {most} bytes (worst case over m 256,1,16: m {worst_m})")), "{text}");
    assert!(text.contains("prepared once, outside capture"), "{text}");

    let v = json(&["doctor", "--json"]);
    assert_eq!(v["schema_version"], 1);
}
