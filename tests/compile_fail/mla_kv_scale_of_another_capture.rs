// The per-tensor scale of an fp8 KV cache bound in one (branded) capture cannot be used by another
// capture's decode: that graph would bake in a buffer it does not keep alive.
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::{decode_captured, KvFormat, MlaDecodeArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;

fn f(a: &mut Stream, b: &mut Stream, buf: &DeviceBuffer, scale: &DeviceBuffer, ws: &mut Workspace) -> graphsafe::Result<()> {
    a.capture(CaptureMode::ThreadLocal, |cap_a| {
        let s = cap_a.bind_buffer(scale)?;
        b.capture(CaptureMode::ThreadLocal, |cap_b| {
            let w = cap_b.bind_workspace(ws)?;
            let m = cap_b.bind_buffer(buf)?;
            let t = |dt, shape: &[usize]| Tensor::contiguous(m.clone(), dt, shape);
            let args = MlaDecodeArgs::new(
                t(DType::Bf16, &[1, 16, 512]),
                t(DType::Bf16, &[1, 16, 64]),
                t(DType::Fp8E4m3, &[1, 64, 576]),
                t(DType::I32, &[1]),
                t(DType::I32, &[1, 1]),
                t(DType::Bf16, &[1, 16, 512]),
            )
            .with_kv_format(KvFormat::Fp8PerTensor { scale: Tensor::contiguous(s.clone(), DType::F32, &[1]) })
            .with_sm_scale(0.07)
            .with_max_seq_len(64);
            decode_captured(&args, &w, cap_b).map(drop)
        })?;
        Ok(())
    })?;
    Ok(())
}

fn main() {}
