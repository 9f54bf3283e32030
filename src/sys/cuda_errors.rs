//! The CUDA runtime's error names (`cudaError_t`, `driver_types.h`), so that an error from the
//! kernels' runtime says `cudaErrorInsufficientDriver` rather than 35. The kernels carry their own
//! copy of the runtime (`cudart_static`), whose `cudaGetErrorName` is not reachable from Rust
//! without another glue entry point; the names are CUDA's stable enum, checked against the
//! toolkit's header by this file's test.
//!
//! Written from CUDA 13.0's `driver_types.h` (the provisioned toolkit's); a code a newer runtime
//! adds is reported by number alone.

/// `(code, name)` of every `cudaError_t` of CUDA 13.0, by code.
const NAMES: &[(i32, &str)] = &[
    (0, "cudaSuccess"),
    (1, "cudaErrorInvalidValue"),
    (2, "cudaErrorMemoryAllocation"),
    (3, "cudaErrorInitializationError"),
    (4, "cudaErrorCudartUnloading"),
    (5, "cudaErrorProfilerDisabled"),
    (6, "cudaErrorProfilerNotInitialized"),
    (7, "cudaErrorProfilerAlreadyStarted"),
    (8, "cudaErrorProfilerAlreadyStopped"),
    (9, "cudaErrorInvalidConfiguration"),
    (12, "cudaErrorInvalidPitchValue"),
    (13, "cudaErrorInvalidSymbol"),
    (16, "cudaErrorInvalidHostPointer"),
    (17, "cudaErrorInvalidDevicePointer"),
    (18, "cudaErrorInvalidTexture"),
    (19, "cudaErrorInvalidTextureBinding"),
    (20, "cudaErrorInvalidChannelDescriptor"),
    (21, "cudaErrorInvalidMemcpyDirection"),
    (22, "cudaErrorAddressOfConstant"),
    (23, "cudaErrorTextureFetchFailed"),
    (24, "cudaErrorTextureNotBound"),
    (25, "cudaErrorSynchronizationError"),
    (26, "cudaErrorInvalidFilterSetting"),
    (27, "cudaErrorInvalidNormSetting"),
    (28, "cudaErrorMixedDeviceExecution"),
    (31, "cudaErrorNotYetImplemented"),
    (32, "cudaErrorMemoryValueTooLarge"),
    (34, "cudaErrorStubLibrary"),
    (35, "cudaErrorInsufficientDriver"),
    (36, "cudaErrorCallRequiresNewerDriver"),
    (37, "cudaErrorInvalidSurface"),
    (43, "cudaErrorDuplicateVariableName"),
    (44, "cudaErrorDuplicateTextureName"),
    (45, "cudaErrorDuplicateSurfaceName"),
    (46, "cudaErrorDevicesUnavailable"),
    (49, "cudaErrorIncompatibleDriverContext"),
    (52, "cudaErrorMissingConfiguration"),
    (53, "cudaErrorPriorLaunchFailure"),
    (65, "cudaErrorLaunchMaxDepthExceeded"),
    (66, "cudaErrorLaunchFileScopedTex"),
    (67, "cudaErrorLaunchFileScopedSurf"),
    (68, "cudaErrorSyncDepthExceeded"),
    (69, "cudaErrorLaunchPendingCountExceeded"),
    (98, "cudaErrorInvalidDeviceFunction"),
    (100, "cudaErrorNoDevice"),
    (101, "cudaErrorInvalidDevice"),
    (102, "cudaErrorDeviceNotLicensed"),
    (103, "cudaErrorSoftwareValidityNotEstablished"),
    (127, "cudaErrorStartupFailure"),
    (200, "cudaErrorInvalidKernelImage"),
    (201, "cudaErrorDeviceUninitialized"),
    (205, "cudaErrorMapBufferObjectFailed"),
    (206, "cudaErrorUnmapBufferObjectFailed"),
    (207, "cudaErrorArrayIsMapped"),
    (208, "cudaErrorAlreadyMapped"),
    (209, "cudaErrorNoKernelImageForDevice"),
    (210, "cudaErrorAlreadyAcquired"),
    (211, "cudaErrorNotMapped"),
    (212, "cudaErrorNotMappedAsArray"),
    (213, "cudaErrorNotMappedAsPointer"),
    (214, "cudaErrorECCUncorrectable"),
    (215, "cudaErrorUnsupportedLimit"),
    (216, "cudaErrorDeviceAlreadyInUse"),
    (217, "cudaErrorPeerAccessUnsupported"),
    (218, "cudaErrorInvalidPtx"),
    (219, "cudaErrorInvalidGraphicsContext"),
    (220, "cudaErrorNvlinkUncorrectable"),
    (221, "cudaErrorJitCompilerNotFound"),
    (222, "cudaErrorUnsupportedPtxVersion"),
    (223, "cudaErrorJitCompilationDisabled"),
    (224, "cudaErrorUnsupportedExecAffinity"),
    (225, "cudaErrorUnsupportedDevSideSync"),
    (226, "cudaErrorContained"),
    (300, "cudaErrorInvalidSource"),
    (301, "cudaErrorFileNotFound"),
    (302, "cudaErrorSharedObjectSymbolNotFound"),
    (303, "cudaErrorSharedObjectInitFailed"),
    (304, "cudaErrorOperatingSystem"),
    (400, "cudaErrorInvalidResourceHandle"),
    (401, "cudaErrorIllegalState"),
    (402, "cudaErrorLossyQuery"),
    (500, "cudaErrorSymbolNotFound"),
    (600, "cudaErrorNotReady"),
    (700, "cudaErrorIllegalAddress"),
    (701, "cudaErrorLaunchOutOfResources"),
    (702, "cudaErrorLaunchTimeout"),
    (703, "cudaErrorLaunchIncompatibleTexturing"),
    (704, "cudaErrorPeerAccessAlreadyEnabled"),
    (705, "cudaErrorPeerAccessNotEnabled"),
    (708, "cudaErrorSetOnActiveProcess"),
    (709, "cudaErrorContextIsDestroyed"),
    (710, "cudaErrorAssert"),
    (711, "cudaErrorTooManyPeers"),
    (712, "cudaErrorHostMemoryAlreadyRegistered"),
    (713, "cudaErrorHostMemoryNotRegistered"),
    (714, "cudaErrorHardwareStackError"),
    (715, "cudaErrorIllegalInstruction"),
    (716, "cudaErrorMisalignedAddress"),
    (717, "cudaErrorInvalidAddressSpace"),
    (718, "cudaErrorInvalidPc"),
    (719, "cudaErrorLaunchFailure"),
    (720, "cudaErrorCooperativeLaunchTooLarge"),
    (721, "cudaErrorTensorMemoryLeak"),
    (800, "cudaErrorNotPermitted"),
    (801, "cudaErrorNotSupported"),
    (802, "cudaErrorSystemNotReady"),
    (803, "cudaErrorSystemDriverMismatch"),
    (804, "cudaErrorCompatNotSupportedOnDevice"),
    (805, "cudaErrorMpsConnectionFailed"),
    (806, "cudaErrorMpsRpcFailure"),
    (807, "cudaErrorMpsServerNotReady"),
    (808, "cudaErrorMpsMaxClientsReached"),
    (809, "cudaErrorMpsMaxConnectionsReached"),
    (810, "cudaErrorMpsClientTerminated"),
    (811, "cudaErrorCdpNotSupported"),
    (812, "cudaErrorCdpVersionMismatch"),
    (900, "cudaErrorStreamCaptureUnsupported"),
    (901, "cudaErrorStreamCaptureInvalidated"),
    (902, "cudaErrorStreamCaptureMerge"),
    (903, "cudaErrorStreamCaptureUnmatched"),
    (904, "cudaErrorStreamCaptureUnjoined"),
    (905, "cudaErrorStreamCaptureIsolation"),
    (906, "cudaErrorStreamCaptureImplicit"),
    (907, "cudaErrorCapturedEvent"),
    (908, "cudaErrorStreamCaptureWrongThread"),
    (909, "cudaErrorTimeout"),
    (910, "cudaErrorGraphExecUpdateFailure"),
    (911, "cudaErrorExternalDevice"),
    (912, "cudaErrorInvalidClusterSize"),
    (913, "cudaErrorFunctionNotLoaded"),
    (914, "cudaErrorInvalidResourceType"),
    (915, "cudaErrorInvalidResourceConfiguration"),
    (999, "cudaErrorUnknown"),
];

/// The name of `cudaError_t` `code` (`35` → `"cudaErrorInsufficientDriver"`), if CUDA 13.0 has one.
pub fn name(code: i32) -> Option<&'static str> {
    NAMES.binary_search_by_key(&code, |&(c, _)| c).ok().map(|i| NAMES[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_names_the_codes_graphsafe_explains() {
        assert!(NAMES.windows(2).all(|w| w[0].0 < w[1].0), "sorted by code, each code once");
        assert_eq!(name(35), Some("cudaErrorInsufficientDriver"));
        assert_eq!(name(100), Some("cudaErrorNoDevice"));
        assert_eq!(name(209), Some("cudaErrorNoKernelImageForDevice"));
        assert_eq!(name(700), Some("cudaErrorIllegalAddress"));
        assert_eq!(name(0), Some("cudaSuccess"));
        assert_eq!(name(-1), None);
        assert_eq!(name(1234), None);
    }

    /// Every `cudaError_t` of the toolkit this copy was built with has its name here, at its code
    /// (the header is read when the test compiles, so the test executable carries it). The table
    /// is CUDA 13.0's: with that runtime it must hold exactly the header's codes.
    #[cfg(not(graphsafe_no_kernels))]
    #[test]
    fn the_names_are_the_toolkits() {
        const HEADER: &str = include_str!(concat!(env!("GRAPHSAFE_BUILD_CUDA_INCLUDE"), "/driver_types.h"));
        let start = HEADER.find("enum __device_builtin__ cudaError").expect("driver_types.h declares enum cudaError");
        let body = &HEADER[start..];
        let body = &body[..body.find("};").expect("the enum ends")];
        let mut seen = Vec::new();
        for line in body.lines() {
            let Some((ident, value)) = line.split_once('=') else { continue };
            let ident = ident.trim();
            if !ident.starts_with("cuda") || ident.contains(' ') {
                continue;
            }
            let code: i32 = value.trim().trim_end_matches(',').trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
            assert_eq!(name(code), Some(ident), "code {code}");
            seen.push(code);
        }
        assert!(seen.len() > 100, "parsed {} codes", seen.len());
        if crate::build_info::runtime_version() == Some((13, 0)) {
            seen.sort();
            assert_eq!(seen, NAMES.iter().map(|&(c, _)| c).collect::<Vec<_>>());
        }
    }
}
