// The C ABI takes raw pointers only a caller can vouch for: from Rust it is `unsafe` to call
// (before, this compiled, and wrote through a garbage pointer).
fn main() {
    let _ = graphsafe::capi::graphsafe_nvfp4_scale_bytes(128, 64, 0x10 as *mut u64);
}
