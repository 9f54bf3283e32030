//! What the type checker proves (invariants 4, 6, 7, 8, 11 of docs/ARCHITECTURE.md): these programs
//! must not compile.
#[test]
fn captured_workspaces_cannot_grow() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}

/// With the `cudarc` feature: adopting a cudarc stream is `unsafe` (the engine can still reach it
/// through cudarc's safe API while graphsafe captures), and a slice is adopted only when every bit
/// pattern is a valid element (`from_cudarc_of_bool`: graphsafe writes arbitrary bytes that cudarc
/// then reads as `T`).
#[cfg(feature = "cudarc")]
#[test]
fn cudarc_streams_are_adopted_with_unsafe() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail_cudarc/*.rs");
}
