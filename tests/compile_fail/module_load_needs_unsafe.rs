// The driver reads a module image up to the size its own header declares (or to a NUL, for PTX),
// not the slice's length: a truncated or garbage image is an out-of-bounds read. Loading one is
// `unsafe` (before, this compiled, and the driver read past the 8 bytes).
fn main() {
    let ctx = graphsafe::driver::Context::new(0).unwrap();
    let _ = graphsafe::driver::Module::load(&ctx, b"ABCDEFGH");
}
