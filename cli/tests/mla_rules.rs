//! `graphsafe plan mla` refuses a value past an MLA limit with the library planner's own
//! explanation: the rule is written once (src/ops/mla/plan.rs) and the CLI only renames the field
//! to its flag.

use graphsafe::ops::mla::{self, MlaArch, MlaLimits, MAX_BATCH, MAX_S_Q, NUM_HEADS};
use graphsafe::Error;
use std::process::Command;

/// The CLI's one-line refusal of `args` (exit code 2).
fn refusal(args: &[&str]) -> String {
    let exe = std::env::var("GRAPHSAFE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_graphsafe").to_string());
    let out = Command::new(exe).args(args).output().expect("run graphsafe");
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8(out.stderr).unwrap()
}

fn explains(arch: MlaArch, l: MlaLimits) -> String {
    match mla::plan(arch, &l) {
        Err(Error::InvalidArgument { expected, .. }) => expected,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn plan_mla_explains_each_limit_as_the_library_does() {
    let (heads, s_q, batch) = ((NUM_HEADS + 1).to_string(), (MAX_S_Q + 1).to_string(), (MAX_BATCH + 1).to_string());
    let l = MlaLimits::new(16, 1, 4096, 132);
    for (arch, flag) in [(MlaArch::Sm90, "sm_90"), (MlaArch::Sm100, "sm_100")] {
        let base = ["plan", "mla", "--arch", flag, "--sm-count", "132", "--seq-len", "4096"];
        let cases: [(&[&str], &str, MlaLimits); 4] = [
            (&["--heads", &heads, "--batch", "1"], "`--heads`", MlaLimits::new(NUM_HEADS as u32 + 1, 1, 4096, 132)),
            (&["--heads", "16", "--s-q", &s_q, "--batch", "1"], "`--s-q`", l.with_s_q(MAX_S_Q as u32 + 1)),
            (&["--heads", "16", "--batch", &batch], "`--batch`", MlaLimits::new(16, MAX_BATCH as u32 + 1, 4096, 132)),
            (&["--heads", "16", "--batch", "1", "--page-size", "48"], "`--page-size`", l.with_page_size(48)),
        ];
        for (extra, subject, limits) in cases {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            let err = refusal(&args);
            let want = explains(arch, limits);
            assert!(err.contains(&format!("invalid argument {subject}: expected {want},")), "{args:?}: {err} does not explain {want:?}");
        }
    }
}
