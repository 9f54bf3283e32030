//! Worst cases: the planners' answer equals the model's maximum over every shape of small domains,
//! and on large domains up to the limits is a real shape no sampled or listed shape needs more than.

use super::*;

// ---- worst cases ------------------------------------------------------------------------------

/// The model's maximum over every (batch, tokens, length) of the domain: for sm100 over every
/// length when the domain is small, else over every tile count (the rule and the layout are
/// functions of the tile count, the largest length of each count standing for it).
fn m100_worst(max_b: i64, (h, max_s_q): Hq, max_seq: i64, page: i64, sm: i64, req: Option<i64>) -> Option<u128> {
    let every_len = max_seq <= 4096;
    let lens: Vec<i64> = if every_len {
        (1..=max_seq).collect()
    } else {
        (1..=div_up(max_seq as u128, 128) as i64).map(|t| (t * 128).min(max_seq)).collect()
    };
    let mut worst = None;
    for b in 1..=max_b {
        for s_q in 1..=max_s_q {
            for &seq in &lens {
                if let Some((_, ws)) = m100_plan(DType::Bf16, b, (h, s_q), seq, page, sm, req) {
                    worst = worst.max(Some(ws));
                }
            }
        }
    }
    worst
}

/// sm90: every tile count (the rule's input) for every batch.
/// The most over every batch, tile count and token count (up to s_q) of the domain.
fn m90_worst(max_b: i64, (h, s_q): (i64, i64), max_seq: i64, sm: i64, req: Option<i64>) -> Option<u128> {
    let mut worst = None;
    for s in 1..=s_q {
        for b in 1..=max_b {
            for t in 1..=div_up(max_seq as u128, 64) as i64 {
                if let Some((_, ws)) = m90_plan(b, (h, s), (t * 64).min(max_seq), sm, req) {
                    worst = worst.max(Some(ws));
                }
            }
        }
    }
    worst
}

#[test]
fn worst_cases_equal_the_model_maximum_over_every_shape() {
    let mut rng = Rng(0x776f_7273_7463_6173); // "worstcas"
    let mut cases = 0;
    for i in 0..160 {
        let max_b = rng.pick(1, if i % 4 == 0 { 40 } else { 5 });
        let max_seq = if i % 3 == 0 { rng.pick(1, 4096) } else { rng.pick(1, 128 * 600) };
        let sm = rng.pick(1, 1024);
        let page = 1 << rng.below(8);
        let req = if rng.below(3) == 0 { Some(rng.pick(1, 17)) } else { None };
        let hq = [(128, 1), (128, 1), (16, 1), (128, 3), (7, 2), (64, 4)][rng.below(6) as usize];
        // The scan is max_b x s_q x lengths: keep it small when tokens multiply it.
        let max_seq = if hq.1 > 1 { max_seq.min(128 * 80) } else { max_seq };
        let ctx = format!("sm100 max_b={max_b} (heads, s_q)={hq:?} max_seq={max_seq} page={page} sm={sm} req={req:?}");
        let got = sm100::worst_case(&shape(DType::Bf16, max_b, hq, max_seq, page, sm), req);
        match m100_worst(max_b, hq, max_seq, page, sm, req) {
            None => invalid(got, &ctx),
            Some(ws) => {
                let w = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(w.workspace_bytes as u128, ws, "{ctx}");
                // The reported shape is a shape of the domain that needs exactly that much.
                assert!(w.batch as i64 <= max_b && w.max_seq_len as i64 <= max_seq && w.s_q as i64 <= hq.1, "{ctx}: {w:?}");
                assert_eq!(m100_plan(DType::Bf16, w.batch as i64, (hq.0, w.s_q as i64), w.max_seq_len as i64, page, sm, req).map(|p| p.1), Some(ws), "{ctx}");
            }
        }
        cases += 1;
    }
    for i in 0..120 {
        // Batches past 2·sm/ceil(h/64) never split: a few SMs let the scan cover such batches.
        let sm = if i % 2 == 0 { rng.pick(1, 12) } else { rng.pick(1, 300) };
        let max_b = if i % 2 == 0 { rng.pick(1, 40) } else { rng.pick(1, 4) };
        let max_seq = rng.pick(1, 64 * if i % 2 == 0 { 300 } else { 700 });
        let h = rng.pick(1, 128);
        let s_q = [1, 1, 2, 3][rng.below(4) as usize];
        let req = if rng.below(4) == 0 { Some(rng.pick(1, 300)) } else { None };
        let ctx = format!("sm90 max_b={max_b} h={h} s_q={s_q} max_seq={max_seq} sm={sm} req={req:?}");
        let got = sm90::worst_case(DType::Bf16, h, s_q, max_b, max_seq, sm, req);
        match m90_worst(max_b, (h, s_q), max_seq, sm, req) {
            None => invalid(got, &ctx),
            Some(ws) => {
                let w = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(w.workspace_bytes as u128, ws, "{ctx}");
                assert!(w.batch as i64 <= max_b && w.max_seq_len as i64 <= max_seq && w.s_q as i64 <= s_q, "{ctx}: {w:?}");
                assert_eq!(m90_plan(w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, sm, req).map(|p| p.1), Some(ws), "{ctx}");
            }
        }
        cases += 1;
    }
    eprintln!("{cases} worst cases equal the model maximum");
}

#[test]
fn no_pre_grow_is_below_a_printed_row_up_to_the_limits() {
    // What `graphsafe plan mla` prints: a row per listed batch at the longest length, with the
    // same split request, and the pre-grow from worst_case. Large domains included: the rows and
    // a sample of other shapes of the domain are checked against the model, never above it.
    let mut rng = Rng(0x7072_6567_726f_7773); // "pregrows"
    let mut rows = 0;
    for i in 0..400 {
        let sm = rng.pick(1, 1024);
        let page = 1 << rng.below(8);
        let max_seq = rng.pick(1, MAX_SEQ_LEN);
        let (h, s_q) = [(128, 1), (128, 1), (32, 1), (128, 2), (16, 4), (1, 16)][rng.below(6) as usize];
        // Largest batch with batch × s_q × columns within int32 for this length and page size,
        // and batch × s_q within the grid.
        let cols = div_up(max_seq as u128, 128) * (128 / page as u128);
        let b_cap = ((I32_MAX / cols / s_q as u128) as i64).min(MAX_BATCH / s_q);
        if b_cap < 1 {
            continue;
        }
        let list: Vec<i64> = (0..1 + rng.below(4)).map(|_| rng.pick(1, b_cap)).collect();
        let max_b = *list.iter().max().unwrap();
        let req = match i % 3 {
            0 => None,
            1 => Some(1),
            _ => Some(rng.pick(1, 16)),
        };
        let w = match sm100::worst_case(&shape(DType::Fp16, max_b, (h, s_q), max_seq, page, sm), req) {
            Ok(w) => w,
            Err(e) => {
                // Only an explicit count no shape of the domain allows is refused.
                assert!(req.is_some_and(|r| r as u128 > m100_cap(1, max_seq, sm)), "sm100 {max_b} {h} {s_q} {max_seq} {page} {sm} {req:?}: {e}");
                continue;
            }
        };
        assert_eq!(Some(w.workspace_bytes as u128), m100_plan(DType::Fp16, w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, page, sm, req).map(|p| p.1));
        let mut shapes: Vec<(i64, i64, i64)> = list.iter().map(|&b| (b, s_q, max_seq)).collect();
        shapes.extend((0..25).map(|_| (rng.pick(1, max_b), rng.pick(1, s_q), rng.pick(1, max_seq))));
        for (b, s, seq) in shapes {
            if let Some((_, ws)) = m100_plan(DType::Fp16, b, (h, s), seq, page, sm, req) {
                assert!(ws <= w.workspace_bytes as u128, "sm100 row b={b} h={h} s_q={s} seq={seq} page={page} sm={sm} req={req:?}: {ws} > {}", w.workspace_bytes);
                rows += 1;
            }
        }
    }
    for i in 0..300 {
        let sm = rng.pick(1, 1024);
        let h = rng.pick(1, 128);
        let s_q = [1, 2, 16][rng.below(3) as usize];
        let max_seq = rng.pick(1, MAX_SEQ_LEN);
        let list: Vec<i64> = (0..1 + rng.below(4)).map(|_| rng.pick(1, MAX_BATCH)).collect();
        let max_b = *list.iter().max().unwrap();
        let req = if i % 2 == 0 { None } else { Some(rng.pick(1, 256)) };
        let w = match sm90::worst_case(DType::Bf16, h, s_q, max_b, max_seq, sm, req) {
            Ok(w) => w,
            Err(e) => {
                assert!(req.is_some_and(|r| r as u128 > div_up(max_seq as u128, 64).min(256)), "sm90: {e}");
                continue;
            }
        };
        assert_eq!(Some(w.workspace_bytes as u128), m90_plan(w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, sm, req).map(|p| p.1));
        let mut shapes: Vec<(i64, i64)> = list.iter().map(|&b| (b, max_seq)).collect();
        shapes.extend((0..25).map(|_| (rng.pick(1, max_b.min(2 * sm)), rng.pick(1, max_seq.min(64 * 256)))));
        for (b, seq) in shapes {
            // Every token count up to s_q is covered: a capture of fewer tokens is a row too.
            if let Some((_, ws)) = m90_plan(b, (h, rng.pick(1, s_q)), seq, sm, req) {
                assert!(ws <= w.workspace_bytes as u128, "sm90 row b={b} h={h} seq={seq} sm={sm} req={req:?}: {ws} > {}", w.workspace_bytes);
                rows += 1;
            }
        }
    }
    eprintln!("{rows} rows, none above its pre-grow");
    assert!(rows >= 5000, "{rows}");
}

#[test]
fn worst_cases_at_the_limits_are_real_shapes() {
    // The largest accepted inputs (which used to take an hour): the answer is the model's plan
    // of a shape of the domain, and at least every row an engine would list.
    let w = sm100::worst_case(&shape(DType::Bf16, 128, (128, 1), MAX_SEQ_LEN, 128, 148), None).unwrap();
    assert_eq!(Some(w.workspace_bytes as u128), m100_plan(DType::Bf16, w.batch as i64, (128, 1), w.max_seq_len as i64, 128, 148, None).map(|p| p.1));
    for b in [1, 2, 64, 128] {
        assert!(m100_plan(DType::Bf16, b, (128, 1), MAX_SEQ_LEN, 128, 148, None).unwrap().1 <= w.workspace_bytes as u128);
    }
    let w = sm100::worst_case(&shape(DType::Bf16, MAX_BATCH, (128, 1), 4_194_176, 128, 148), None).unwrap();
    assert_eq!((w.batch as i64, w.max_seq_len), (MAX_BATCH, 4_194_176), "the page table dominates");
    // Padded and expanded at the limits: 32767 requests of 2 tokens of 16 heads (B' = 65534), and
    // B' = 64 requests of the longest length; the staging dominates the first, the page table the second.
    for (b, hq, seq) in [(32_767, (16, 2), 1000), (4, (1, 16), MAX_SEQ_LEN / 2)] {
        let w = sm100::worst_case(&shape(DType::Bf16, b, hq, seq, 128, 148), None).unwrap();
        assert_eq!((w.batch as i64, w.s_q as i64, w.max_seq_len as i64), (b, hq.1, seq), "{hq:?}");
        assert_eq!(Some(w.workspace_bytes as u128), m100_plan(DType::Bf16, b, hq, seq, 128, 148, None).map(|p| p.1));
    }
    // One more request of 2 tokens is past CUTLASS's batch limit: refused by name, for any page size.
    match sm100::worst_case(&shape(DType::Bf16, 32_768, (16, 2), 1000, 64, 148), None) {
        Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "batch x s_q"),
        other => panic!("{other:?}"),
    }
    for (h, s_q) in [(16, 1), (64, 1), (128, 1), (1, 1), (128, 16), (3, 16)] {
        for sm in [1, 132, 1024] {
            let w = sm90::worst_case(DType::Bf16, h, s_q, MAX_BATCH, MAX_SEQ_LEN, sm, None).unwrap();
            assert_eq!(Some(w.workspace_bytes as u128), m90_plan(w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, sm, None).map(|p| p.1));
            for b in [1, 2, sm, MAX_BATCH] {
                for seq in [64 * 256, MAX_SEQ_LEN] {
                    assert!(m90_plan(b.min(MAX_BATCH), (h, s_q), seq, sm, None).unwrap().1 <= w.workspace_bytes as u128, "h={h} sm={sm} b={b} seq={seq}");
                }
            }
        }
    }
}

/// The reduction worst_case relies on for sm90 (proved in cuda-src/mla/sm90/plan.cu): a split
/// count the default picks for T tiles it also picks for exactly that many tiles. Checked here
/// on the model, exhaustively over small rule parameters.
#[test]
fn every_sm90_split_count_is_picked_at_its_own_tile_count() {
    let mut checked = 0u64;
    for sm in (1..=24).chain([66, 132]) {
        for ctas in 1..2 * sm {
            for t in 1..=700 {
                // b = ctas, h = 64: C = ctas.
                let s = m90_splits(ctas, 64, t * 64, sm, None).unwrap();
                let again = m90_splits(ctas, 64, s as i64 * 64, sm, None).unwrap();
                assert_eq!(again, s, "sm={sm} C={ctas} T={t}");
                checked += 1;
            }
        }
    }
    assert!(checked > 100_000);
}
