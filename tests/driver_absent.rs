//! Without a driver (CI, build machines) every entry point answers DriverNotFound listing what it
//! tried, never a panic. With a driver (the GPU machine) the same calls succeed.

use graphsafe::driver::{device_count, driver_version, Context};
use graphsafe::Error;

#[test]
fn missing_driver_is_an_error_value_everywhere() {
    match graphsafe::sys::driver::api() {
        Err(Error::DriverNotFound { tried }) => {
            assert!(tried.iter().any(|t| t.starts_with("libcuda.so.1")), "{tried:?}");
            assert!(matches!(device_count(), Err(Error::DriverNotFound { .. })));
            assert!(matches!(driver_version(), Err(Error::DriverNotFound { .. })));
            assert!(matches!(Context::new(0), Err(Error::DriverNotFound { .. })));
            let msg = device_count().unwrap_err().to_string();
            assert!(msg.contains("CUDA driver not found") && msg.contains("libcuda.so.1"), "{msg}");
        }
        Err(e) => panic!("unexpected error opening the driver: {e}"),
        Ok(_) => {
            let (major, _) = driver_version().expect("a present driver reports its version");
            assert!(major >= 12);
            let n = device_count().expect("a present driver counts devices");
            // An ordinal past the end is an argument error, not a crash.
            assert!(matches!(Context::new(n + 3), Err(Error::InvalidArgument { .. })));
        }
    }
}
