//! The README's table of back-ends is the arch table's (`graphsafe::arch`) as users read it: one
//! line per back-end, in `Backend::ALL` order, naming its op and selector, and GPUs of rows that
//! run it. It lists back-ends, not rows, so a GPU added on an existing back-end (one row of
//! src/arch_table.rs, scripts/check-arch-row) leaves it true; a new back-end needs its line, which
//! a failure names.

use graphsafe::arch::{Backend, TARGETS};

/// The cells of each line of the first table under `## GPUs`, header and separator left out.
fn readme_table() -> Vec<Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let section = readme.split("\n## GPUs\n").nth(1).expect("README.md has no `## GPUs` section");
    let section = section.split("\n## ").next().unwrap();
    let cells = |line: &str| line.trim().trim_start_matches('|').trim_end_matches('|').split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    let lines: Vec<Vec<String>> =
        section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).map(cells).collect();
    assert!(lines.len() >= 2 && lines[1].iter().all(|c| c.starts_with("---")), "README.md's `## GPUs` section has no table: {lines:?}");
    lines.into_iter().skip(2).collect()
}

#[test]
fn the_readmes_backend_table_is_the_arch_tables() {
    let lines = readme_table();
    let selectors: Vec<String> = lines.iter().map(|l| l[1].trim_matches('`').to_string()).collect();
    let want: Vec<String> = Backend::ALL.iter().map(|b| b.selector()).collect();
    assert_eq!(selectors, want, "README.md's GPU table: one line per back-end of src/arch_table.rs, in Backend::ALL order");
    for (line, b) in lines.iter().zip(Backend::ALL) {
        assert_eq!(line.len(), 4, "README.md's GPU table, {}: op, back-end, kernel, GPUs", b.selector());
        assert!(line[0].eq_ignore_ascii_case(b.op().label()), "README.md's GPU table, {}: op {:?} is not {:?}", b.selector(), line[0], b.op().label());
        assert!(!line[2].is_empty(), "README.md's GPU table, {}: no kernel described", b.selector());
        // Every GPU it names is a GPU of a row that runs the back-end (examples, not the list:
        // `graphsafe doctor` prints every row).
        let gpus = line[3].split_once(':').map_or(line[3].as_str(), |(_, g)| g);
        for gpu in gpus.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            assert!(
                TARGETS.iter().any(|t| t.backend(b.op()) == Some(b) && t.gpus.split(',').any(|g| g.trim() == gpu)),
                "README.md's GPU table, {}: {gpu:?} is not a GPU of a row that runs it",
                b.selector()
            );
        }
    }
}
