//! Invariant 4, proved by the type checker: these programs must not compile.
#[test]
fn captured_workspaces_cannot_grow() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
