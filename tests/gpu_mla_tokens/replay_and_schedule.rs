//! A captured two-token decode replayed after growth and churn, and the work schedule of a batched
//! decode against its host model.

use super::*;

/// A captured two-token causal decode (the N kernel at 16 heads, the seesaw at 128): the
/// workspace grown (retiring the captured buffer) and memory churned after capture, then 1,000
/// replays, each checked bit-identical to the eager result every 50 replays (out cleared between).
#[test]
fn a_captured_two_token_decode_replays_bit_identical_after_growth_and_churn() {
    let Some(mut stream) = hopper_gpu(SM90) else { return };
    for s in [
        Shape { cache: Cache::Native(DType::Bf16), heads: 128, s_q: 2, causal: true, page: 64, seq_lens: vec![4000, 1, 77, 2048], splits: None, seed: 7 },
        Shape { cache: Cache::Native(DType::Bf16), heads: 16, s_q: 2, causal: true, page: 64, seq_lens: vec![9000, 2, 300], splits: Some(8), seed: 8 },
    ] {
        let mut ws = Workspace::new(&stream, 0).unwrap();
        let p = build(&stream, &s);
        let a = args(&p);
        let plan = decode(&a, &mut ws, &stream).unwrap();
        assert!(plan.workspace_bytes > 0, "{s:?}: the captured decode uses its workspace");
        let eager = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
        let exec = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let w = cap.bind_workspace(&mut ws).unwrap();
            let ca = a.bind(&mut cap).unwrap();
            assert_eq!(decode_captured(&ca, &w, &cap).unwrap(), plan);
            cap.end().unwrap().instantiate().unwrap()
        };
        ws.ensure_size(ws.capacity() * 2 + (1 << 20), &stream).unwrap(); // retires the captured buffer
        let _held = churn(&stream, &[plan.workspace_bytes as usize, 1 << 20, 4 << 20], 8);
        p.out.memset_u8(0x55, &stream).unwrap();
        p.lse.memset_u8(0x55, &stream).unwrap();
        for i in 0..1000 {
            exec.launch(&stream).unwrap();
            if i % 50 == 49 {
                assert_eq!(p.out.to_host_vec::<u16>(&stream).unwrap(), eager.0, "{s:?}: replay {i}: out");
                assert_eq!(p.lse.to_host_vec::<u32>(&stream).unwrap(), eager.1, "{s:?}: replay {i}: lse");
                p.out.memset_u8(0x55, &stream).unwrap();
                p.lse.memset_u8(0x55, &stream).unwrap();
            }
        }
        eprintln!("{:?} h={} s_q=2 causal: 1000 replays bit-identical to eager ({} splits, {} workspace bytes)", s.cache, s.heads, plan.num_splits, plan.workspace_bytes);
    }
}

/// The work schedule of a batched decode (cuda-src/mla/sm90/schedule.cuh) as the workspace holds
/// it after a decode: the lengths read once (clamped), and every work item, each (request, chunk)
/// a request's length needs exactly once, full chunks first, then the last chunks longest first,
/// then the empty requests, then nothing; equal to this host model of the same rule.
#[test]
fn a_batch_runs_each_work_item_once_longest_first() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let r256 = |x: usize| x.div_ceil(256) * 256;
    let mut checked = 0;
    for (seq_lens, heads, splits) in [
        (vec![4096, 20, 0, 900, 130, 4000, 1, 64, 65, 2049], 128usize, 1u32),
        (vec![4096, 20, 0, 900, 130, 4000, 1, 64, 65, 2049], 16, 3),
        (vec![100, 5000, -3, 77, 5000, 64], 64, 8),
        ((0..300i32).map(|i| i * 37 % 1000).collect(), 32, 2),
        // The schedule kernel's block sizes (schedule.cuh, sched_threads): one warp up to 64
        // requests, 256 threads up to 512, 1024 up to 2048.
        ((0..64i32).map(|i| i * 53 % 3000).collect(), 16, 2),
        ((0..65i32).map(|i| i * 53 % 3000).collect(), 32, 3),
        ((0..1500i32).map(|i| i * 37 % 700).collect(), 16, 2),
    ] {
        let s = Shape { cache: Cache::Native(DType::Bf16), heads, s_q: 1, causal: false, page: 64, seq_lens, splits: Some(splits), seed: 3 };
        let p = build(&stream, &s);
        let mut ws = Workspace::new(&stream, 0).unwrap();
        // A length beyond max_seq_len in the device data: clamped by the schedule like every kernel.
        let mut lens = s.seq_lens.clone();
        lens[1] = i32::MAX;
        p.seq_lens.copy_from_host(&lens, &stream).unwrap();
        let plan = decode(&args(&p), &mut ws, &stream).unwrap();
        assert_eq!(plan.num_splits, splits);
        let bytes = ws.to_host_vec(&stream).unwrap();
        let (b, sp, rows) = (p.batch, splits as usize, heads);
        let partials = if sp > 1 { r256(b * sp * rows * 2048) + r256(b * sp * rows * 4) } else { 0 };
        let word = |off: usize| i32::from_le_bytes(bytes[off..off + 4].try_into().unwrap());
        let got_lens: Vec<i32> = (0..b).map(|i| word(partials + 4 * i)).collect();
        let got_items: Vec<i32> = (0..b * sp).map(|i| word(partials + r256(4 * b) + 4 * i)).collect();
        // The host model.
        let max_seq = p.max_seq as i32;
        let want_lens: Vec<i32> = lens.iter().map(|&l| l.clamp(0, max_seq)).collect();
        assert_eq!(got_lens, want_lens);
        let chunk = (p.max_seq.div_ceil(64)).div_ceil(sp) as i64;
        let chunks = |l: i32| ((l as i64 + 63) / 64 + chunk - 1) / chunk;
        let key = |l: i32| {
            let t = (l as i64 + 63) / 64;
            let n = chunks(l);
            if n == 0 { 1024 } else { (chunk - (t - (n - 1) * chunk)) * 1023 / chunk }
        };
        let mut order: Vec<usize> = (0..b).collect();
        order.sort_by_key(|&i| key(want_lens[i])); // stable, as the device's radix sort
        let mut want = Vec::new();
        for &i in &order {
            for c in 0..(chunks(want_lens[i]) - 1).max(0) {
                want.push(((i as i32) << 16) | c as i32);
            }
        }
        for &i in &order {
            want.push(((i as i32) << 16) | (chunks(want_lens[i]) - 1).max(0) as i32);
        }
        want.resize(b * sp, -1);
        assert_eq!(got_items, want, "{} requests, {splits} splits", b);
        checked += 1;
    }
    assert_eq!(checked, 7);
}
