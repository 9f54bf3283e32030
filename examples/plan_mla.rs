//! Size an MLA workspace before capturing: the worst case over every batch size and sequence
//! length an engine will capture, for one GPU. Runs without a GPU.
//!
//! `cargo run --example plan_mla -- 256 131072 148 64`  (max batch, max seq len, SMs, page size)

use graphsafe::ops::mla::{sm100, KV_DTYPES};
use graphsafe::workspace::WorkspacePlanner;

fn main() -> graphsafe::Result<()> {
    let args: Vec<i64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (max_batch, max_seq, sms) = (*args.first().unwrap_or(&256), *args.get(1).unwrap_or(&131_072), *args.get(2).unwrap_or(&148));
    let page_size = *args.get(3).unwrap_or(&64);
    let mut planner = WorkspacePlanner::new();
    for dtype in KV_DTYPES {
        let w = sm100::worst_case(&sm100::Shape::new(dtype, max_batch, max_seq, page_size, sms), None)?;
        planner.require(format!("mla {dtype} batch {} seq {} ({} splits)", w.batch, w.max_seq_len, w.num_splits), w.workspace_bytes);
    }
    let worst = planner.worst().expect("three requirements were added");
    println!("pre-grow to {} bytes before capture (worst: {})", planner.bytes(), worst.label);
    Ok(())
}
