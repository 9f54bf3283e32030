//! One driver for cudarc and graphsafe, however cudarc reaches it: built by ../Cargo.toml, cudarc
//! links `libcuda.so` (candle's `dynamic-linking`); by ../../cudarc-cuda12080, cudarc opens
//! `libcuda.so` with `dlopen` (dynamic loading); graphsafe opens `libcuda.so.1` with `dlopen`.
//! Prints whether both call one loaded driver, then adopts cudarc's context of device 0 (refused
//! when they do not: exit 1 with the refusal). .ci/run runs it on the stand-in driver installed as
//! `libcuda.so.1`, once as is (one driver) and once with GRAPHSAFE_CUDA_DRIVER naming a copy of it
//! (two drivers); on a GPU machine it runs on the real one.
use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    // graphsafe first: it answers without panicking when there is no driver.
    let devices = graphsafe::driver::device_count()?;
    println!("devices: {devices}");
    println!("one driver: {}", graphsafe::driver::cudarc::shares_driver()?);
    let cudarc_ctx = cudarc::driver::CudaContext::new(0)?;
    let ctx = graphsafe::driver::Context::from_cudarc(&cudarc_ctx)?;
    println!("adopted cudarc's context: device {}, sm_{}{}", ctx.device().ordinal(), ctx.compute_capability().0, ctx.compute_capability().1);
    Ok(())
}
