//! The README's table of GPUs is the arch table (`graphsafe::arch::TARGETS`) as users read it:
//! one line per row, in the table's order, each with the compute capabilities and GPUs of its row
//! and, per op, the description of the row's back-end ("—" where the op has no kernel). A back-end
//! is described the same way on every line that runs it, so a row added on existing back-ends has
//! exactly one right line, which a failure prints.

use graphsafe::arch::{cc_name, Backend, Op, Target, TARGETS};
use std::collections::HashMap;

const NONE: &str = "—";

/// The cells of each line of the first table under `## GPUs`: its header first.
fn readme_table() -> Vec<Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let section = readme.split("\n## GPUs\n").nth(1).expect("README.md has no `## GPUs` section");
    let section = section.split("\n## ").next().unwrap();
    let cells = |line: &str| line.trim().trim_start_matches('|').trim_end_matches('|').split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    let lines: Vec<Vec<String>> =
        section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).map(cells).collect();
    assert!(lines.len() >= 2 && lines[1].iter().all(|c| c.starts_with("---")), "README.md's `## GPUs` section has no table: {lines:?}");
    lines.into_iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, l)| l).collect()
}

/// `sm_100, sm_103: B200, GB200, B300, GB300`.
fn runs_on(t: &Target) -> String {
    let ccs: Vec<String> = t.runs_on.iter().map(|&cc| cc_name(cc)).collect();
    format!("{}: {}", ccs.join(", "), t.gpus)
}

#[test]
fn the_readmes_gpu_table_is_the_arch_table() {
    let table = readme_table();
    let (header, lines) = table.split_first().unwrap();
    // The columns: the row, where it runs, then one per op with back-ends, in the table's order.
    assert_eq!(header.len(), 2 + Op::WITH_BACKENDS.len(), "README.md's GPU table header: {header:?}");
    for (cell, op) in header[2..].iter().zip(Op::WITH_BACKENDS) {
        assert!(cell.eq_ignore_ascii_case(op.label()), "README.md's GPU table: column {cell:?} is not {}", op.label());
    }

    // Each back-end's description, from the lines of the rows that run it.
    let mut described: HashMap<Backend, &str> = HashMap::new();
    for line in lines {
        let Some(t) = TARGETS.iter().find(|t| line[0] == format!("`{}`", t.name)) else { continue };
        for (op, cell) in Op::WITH_BACKENDS.into_iter().zip(&line[2..]) {
            if let Some(b) = t.backend(op) {
                let first = *described.entry(b).or_insert(cell);
                assert_eq!(cell, first, "README.md's GPU table describes {} {} two ways", op.name(), b.name());
            }
        }
    }

    let expected: Vec<String> = TARGETS
        .iter()
        .map(|t| {
            let ops = Op::WITH_BACKENDS.map(|op| match t.backend(op) {
                None => NONE.to_string(),
                Some(b) => described.get(&b).map_or_else(|| format!("(describe {} {})", op.name(), b.name()), |d| d.to_string()),
            });
            format!("| `{}` | {} | {} |", t.name, runs_on(t), ops.join(" | "))
        })
        .collect();
    let got: Vec<String> = lines.iter().map(|l| format!("| {} |", l.join(" | "))).collect();
    assert_eq!(
        got,
        expected,
        "README.md's GPU table is not the arch table (src/arch_table.rs): its lines should be\n{}\n",
        expected.join("\n")
    );
    for (b, d) in &described {
        assert!(!d.is_empty() && *d != NONE, "README.md's GPU table has no description of {}", b.selector());
    }
}
