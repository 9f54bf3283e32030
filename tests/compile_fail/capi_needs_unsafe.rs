// The C ABI takes raw pointers only a caller can vouch for: from Rust it is `unsafe` to call.
fn main() {
    let mut plan = std::mem::MaybeUninit::uninit();
    let _ = graphsafe::capi::graphsafe_mla_plan(90, 0, 16, 1, 4096, 132, 0, plan.as_mut_ptr());
}
