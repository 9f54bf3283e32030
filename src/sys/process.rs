//! Process-wide facts from the C library: what graphsafe needs outside the driver and cuDNN.

/// A number unique among this process's live pthread keys, taken for good: a key is created and
/// never deleted, so no later caller in the process (another load of this library after a
/// `dlclose`, another copy of it linked elsewhere) is handed the same one. `None` when the process
/// has no key left (glibc allows 1024).
pub(crate) fn leak_pthread_key() -> Option<u32> {
    let mut key: std::ffi::c_uint = 0;
    // SAFETY: an out-pointer to a local, and no destructor.
    (unsafe { pthread_key_create(&mut key, None) } == 0).then_some(key)
}

extern "C" {
    // POSIX (libc): `pthread_key_t` is an unsigned int on Linux.
    fn pthread_key_create(key: *mut std::ffi::c_uint, destructor: Option<unsafe extern "C" fn(*mut std::ffi::c_void)>) -> std::ffi::c_int;
}
