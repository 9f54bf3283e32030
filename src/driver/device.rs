use super::{check, init};
use crate::error::{Error, Result};
use crate::sys::cuda as c;

/// Number of CUDA devices (0 when the driver has none).
pub fn device_count() -> Result<usize> {
    let a = init()?;
    let f = a.cuDeviceGetCount()?;
    let mut n = 0;
    // SAFETY: out-pointer to a local.
    check(unsafe { (f.f)(&mut n) }, f.name)?;
    Ok(n.max(0) as usize)
}

/// A CUDA device by ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    pub(crate) raw: c::CUdevice,
    ordinal: usize,
}

/// What `graphsafe doctor` and the ops need to know about a device.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Total device memory in bytes.
    pub total_memory: u64,
}

impl Device {
    /// The device with this ordinal.
    pub fn get(ordinal: usize) -> Result<Device> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::invalid("device", format!("an ordinal below {n} (devices present)"), ordinal));
        }
        let a = init()?;
        let f = a.cuDeviceGet()?;
        let mut raw = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { (f.f)(&mut raw, ordinal as i32) }, f.name)?;
        Ok(Device { raw, ordinal })
    }

    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// One integer attribute.
    pub fn attribute(&self, attr: c::CUdevice_attribute) -> Result<i32> {
        let a = init()?;
        let f = a.cuDeviceGetAttribute()?;
        let mut v = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { (f.f)(&mut v, attr, self.raw) }, f.name)?;
        Ok(v)
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(c::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(c::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> Result<u32> {
        Ok(self.attribute(c::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32)
    }

    /// Name, compute capability, SMs and memory.
    pub fn info(&self) -> Result<DeviceInfo> {
        let a = init()?;
        let f = a.cuDeviceGetName()?;
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: the buffer holds 256 bytes, as passed.
        check(unsafe { (f.f)(buf.as_mut_ptr(), buf.len() as i32, self.raw) }, f.name)?;
        // SAFETY: the driver NUL-terminates within the buffer.
        let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        let f = a.cuDeviceTotalMem()?;
        let mut total = 0usize;
        // SAFETY: out-pointer to a local.
        check(unsafe { (f.f)(&mut total, self.raw) }, f.name)?;
        Ok(DeviceInfo {
            ordinal: self.ordinal,
            name,
            compute_capability: self.compute_capability()?,
            sm_count: self.sm_count()?,
            total_memory: total as u64,
        })
    }
}
