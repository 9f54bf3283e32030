//! cuDNN GEMM through the backend graph API, with workspaces sized before capture (issue 6: in
//! progress).
