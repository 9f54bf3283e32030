//! `graphsafe plan … --help` lists the arch table's rows, read from the table: a row added there
//! shows up in the help (and is accepted by `--arch`) without editing the CLI. The default
//! `--arch` is the table's too (`arch::PLAN_DEFAULT`).

use graphsafe::arch::{Op, GPUS, PLAN_DEFAULT, TARGETS};
use std::process::Command;

fn graphsafe(args: &[&str]) -> std::process::Output {
    let exe = std::env::var("GRAPHSAFE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_graphsafe").to_string());
    Command::new(exe).args(args).output().expect("run graphsafe")
}

/// The `--arch` line of `plan <op> --help`, clap's wrapping undone.
fn arch_help(op: &str) -> String {
    let out = graphsafe(&["plan", op, "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let from = text.find("--arch").expect("an --arch flag");
    let rest = &text[from..];
    // The flag's help runs until the next flag.
    let end = rest[2..].find("\n  -").map_or(rest.len(), |i| i + 2);
    rest[..end].split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn arch_help_lists_exactly_the_rows_with_a_kernel_for_the_op() {
    for (op, flag) in [(Op::Mla, "mla"), (Op::Nvfp4, "nvfp4")] {
        let help = arch_help(flag);
        for t in TARGETS {
            // Each row by its name followed by its compute capabilities: "sm_100f (sm_100, sm_103".
            let ccs: Vec<String> = t.runs_on.iter().map(|&cc| graphsafe::arch::cc_name(cc)).collect();
            let listed = help.contains(&format!("{} ({}", t.name, ccs.join(", ")));
            assert_eq!(listed, op.runs_on(t), "{flag}: {} in {help}", t.name);
            if op.runs_on(t) {
                for g in GPUS.iter().filter(|g| t.runs_on.contains(&g.compute_capability)) {
                    assert!(help.contains(g.name), "{flag}: {} in {help}", g.name);
                }
            }
        }
    }
}

#[test]
fn every_row_listed_plans_and_its_reference_sm_count_is_the_default() {
    for t in TARGETS {
        for (op, args) in [(Op::Mla, &["plan", "mla", "--batch", "1", "--seq-len", "4096", "--heads", "128", "--json"][..]), (Op::Nvfp4, &["plan", "nvfp4", "--m", "1", "--n", "8192", "--k", "8192", "--json"][..])] {
            let out = graphsafe(&[args, &["--arch", t.name]].concat());
            if !op.runs_on(t) {
                assert_eq!(out.status.code(), Some(2), "{} {}", op.name(), t.name);
                continue;
            }
            assert_eq!(out.status.code(), Some(0), "{} {}: {}", op.name(), t.name, String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["target"].as_str(), Some(t.name));
            assert_eq!(v["arch"].as_str(), t.backend(op).map(|b| b.name()));
            assert_eq!(v["sm_count"].as_u64(), Some(u64::from(t.sm_count)), "{}", t.name);
            assert_eq!(v["sm_count_from"].as_str(), Some(t.reference_gpu));
        }
    }
}

#[test]
fn without_arch_both_plans_take_the_tables_default_row() {
    for (op, args) in [("mla", &["plan", "mla", "--batch", "1", "--seq-len", "4096", "--json"][..]), ("nvfp4", &["plan", "nvfp4", "--m", "1", "--n", "8192", "--k", "8192", "--json"][..])] {
        assert!(arch_help(op).contains(&format!("[default: {PLAN_DEFAULT}]")), "{op}: {}", arch_help(op));
        let out = graphsafe(args);
        assert_eq!(out.status.code(), Some(0), "{op}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["target"].as_str(), Some(PLAN_DEFAULT), "{op}");
    }
}
