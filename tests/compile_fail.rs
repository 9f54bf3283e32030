//! What the type checker proves (invariants 4, 6, 7, 8, 11 of docs/ARCHITECTURE.md): these programs
//! must not compile.
#[test]
fn captured_workspaces_cannot_grow() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
