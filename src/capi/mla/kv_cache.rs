//! The C ABI's KV-cache formats: their names, and what an fp8 format needs on every back-end (the
//! op's rule, named by the C arguments), checked before any handle is looked up.

use super::{GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_DS_MLA, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, GRAPHSAFE_MLA_KV_NATIVE};
use crate::capi::Fail;
use crate::ops::mla::{KvFormatKind, MlaArch};
use std::ffi::c_int;

pub(super) fn format_of(f: c_int) -> Result<KvFormatKind, Fail> {
    Ok(match f {
        GRAPHSAFE_MLA_KV_NATIVE => KvFormatKind::Native,
        GRAPHSAFE_MLA_KV_FP8_PER_TENSOR => KvFormatKind::Fp8PerTensor,
        GRAPHSAFE_MLA_KV_FP8_DS_MLA => KvFormatKind::Fp8DsMla,
        other => return Err(crate::Error::invalid("kv_format", "GRAPHSAFE_MLA_KV_NATIVE, _FP8_PER_TENSOR or _FP8_DS_MLA", other).into()),
    })
}

pub(super) fn format_name(f: KvFormatKind) -> &'static str {
    match f {
        KvFormatKind::Native => "GRAPHSAFE_MLA_KV_NATIVE",
        KvFormatKind::Fp8PerTensor => "GRAPHSAFE_MLA_KV_FP8_PER_TENSOR",
        KvFormatKind::Fp8DsMla => "GRAPHSAFE_MLA_KV_FP8_DS_MLA",
    }
}

/// What the decode refuses for an fp8 KV-cache format (the op's rule, `MlaDecodeArgs::plan`),
/// named by the C arguments: no fp8 format on sm_100 (`arch` `None`: the back-end is not known
/// yet, so only the rules every back-end shares), and on sm_90 bf16 q.
pub(super) fn check_kv_format(arch: Option<MlaArch>, format: KvFormatKind, dtype: c_int) -> Result<(), Fail> {
    if format == KvFormatKind::Native {
        return Ok(());
    }
    let name = format_name(format);
    if arch == Some(MlaArch::Sm100) {
        let want = "GRAPHSAFE_MLA_KV_NATIVE on sm_100 (its fp8 path takes fp8 q and KV: GRAPHSAFE_DTYPE_FP8_E4M3)";
        return Err(crate::Error::invalid("kv_format", want, name).into());
    }
    if dtype != GRAPHSAFE_DTYPE_BF16 {
        return Err(crate::Error::invalid("dtype", format!("GRAPHSAFE_DTYPE_BF16 with kv_format {name}"), dtype).into());
    }
    Ok(())
}
