// A guard that makes a graphsafe context current until it is dropped can be dropped out of order
// (or forgotten): here `a`'s guard restores the caller's context while `b`'s still lives, and `b`'s
// then makes `a` current again, leaving a graphsafe context current on the caller's thread. The
// public API makes a context current only for the length of a closure.
use graphsafe::driver::Context;

fn main() {
    let a = Context::new(0).unwrap();
    let b = Context::new(1).unwrap();
    let ga = a.enter().unwrap();
    let gb = b.enter().unwrap();
    drop(ga);
    drop(gb);
}
