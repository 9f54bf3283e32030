//! Prints what graphsafe was built with and whether this machine has a driver.
fn main() {
    println!("graphsafe kernels: {}", graphsafe::build_info::archs().join(", "));
    match graphsafe::driver::device_count() {
        Ok(n) => println!("CUDA devices: {n}"),
        Err(e) => println!("no driver: {e}"),
    }
}
