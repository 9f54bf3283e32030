//! `one_driver` runs on the stand-in driver in CI, which implements only the entry points graphsafe
//! calls (tests/standin): bound lazily, the cudarc functions it never calls need not exist there.
//! (rustc links with `-z now`; the last `-z` option wins.)
fn main() {
    println!("cargo:rustc-link-arg-bin=one_driver=-Wl,-z,lazy");
}
