//! The C ABI's raw-pointer lookups against the last drop of the graphsafe allocation below them.

use super::*;

/// A raw pointer the C ABI resolves (`CallerMemory::pointer`: is it inside a graphsafe allocation?)
/// against the last drop of the graphsafe allocation just below it, on another thread. The lookup
/// once upgraded the registry's weak reference of that allocation under the registry lock to test
/// its bounds; when the other thread dropped its handle meanwhile, the lookup's temporary became
/// the last reference and the allocation's drop re-entered the registry lock on the same thread:
/// a deadlock of both threads, and of every later allocation and free in the process.
///
/// Engine memory X (1 MiB: mmap'd, at a high address) is allocated first; a churning thread
/// creates and destroys 1 MiB graphsafe buffers, which land below X; the lookup thread calls
/// graphsafe_nvfp4_quantize with X as the output's codes and a null scales pointer, so every call
/// looks X up and then fails with NULL_POINTER, before any launch (nothing reaches the kernel glue).
#[test]
fn raw_pointer_lookups_against_the_last_drop_of_the_allocation_below() {
    const RUN: Duration = Duration::from_secs(3);
    let (_g, _s) = standin::exclusive();
    let rust_ctx = graphsafe::driver::Context::new(0).unwrap();
    let x = standin::engine_memory::alloc(&rust_ctx, 1 << 20);
    let mut ctx = GraphsafeContext { id: 0 };
    let mut stream = GraphsafeStream { id: 0 };
    // SAFETY: out-pointers to locals.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut ctx), OK, "{}", last_error());
        assert_eq!(graphsafe_stream_create(ctx, &mut stream), OK, "{}", last_error());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (lookups, churns, below) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let churn = {
        let (stop, churns, below) = (stop.clone(), churns.clone(), below.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                let mut b = GraphsafeBuffer { id: 0 };
                let (mut ptr, mut bytes) = (0u64, 0u64);
                // SAFETY: out-pointers to locals; handles this thread made.
                unsafe {
                    assert_eq!(graphsafe_buffer_create(stream, 1 << 20, 0, &mut b), OK, "{}", last_error());
                    assert_eq!(graphsafe_buffer_info(b, &mut ptr, &mut bytes), OK);
                    assert_eq!(graphsafe_buffer_destroy(b), OK);
                }
                if ptr + bytes <= x {
                    below.fetch_add(1, Relaxed);
                }
                churns.fetch_add(1, Relaxed);
            }
        })
    };
    let lookup = {
        let (stop, lookups) = (stop.clone(), lookups.clone());
        std::thread::spawn(move || {
            let out = GraphsafeNvfp4Matrix { packed: x, scales: 0, global_scale: 0, rows: 16, k: 64 };
            while !stop.load(Relaxed) {
                // SAFETY: `out` is a valid matrix description; x is live device memory of the device.
                let r = unsafe { graphsafe_nvfp4_quantize(x, GRAPHSAFE_DTYPE_BF16, 16, 64, 64, &out, stream) };
                assert_eq!(r, GRAPHSAFE_ERROR_NULL_POINTER, "{}", last_error());
                lookups.fetch_add(1, Relaxed);
            }
        })
    };
    // Watchdog: both threads keep making progress until told to stop, then end; a deadlock cannot
    // be unwound, so it exits the process.
    let start = Instant::now();
    let mut last = (0, 0, Instant::now());
    while !(churn.is_finished() && lookup.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        if start.elapsed() >= RUN {
            stop.store(true, Relaxed);
        }
        let now = (lookups.load(Relaxed), churns.load(Relaxed));
        if now.0 != last.0 && now.1 != last.1 {
            last = (now.0, now.1, Instant::now());
        } else if last.2.elapsed() > Duration::from_secs(2) {
            eprintln!("deadlock: a thread made no progress for 2 s ({} lookups, {} buffers so far)", now.0, now.1);
            std::process::exit(3);
        }
    }
    churn.join().unwrap();
    lookup.join().unwrap();
    let (n_lookups, n_churns, n_below) = (lookups.load(Relaxed), churns.load(Relaxed), below.load(Relaxed));
    // The race needs both loops to have run many times, with the buffers below X.
    assert!(n_lookups > 1000 && n_churns > 1000, "too few iterations to race: {n_lookups} lookups, {n_churns} buffers");
    assert!(n_below * 2 > n_churns, "the churned buffers should lie below X: {n_below} of {n_churns}");
    // SAFETY: handles made above; X is no longer used.
    unsafe {
        assert_eq!(graphsafe_stream_destroy(stream), OK);
        assert_eq!(graphsafe_context_destroy(ctx), OK);
        standin::engine_memory::free(&rust_ctx, x);
    }
}
