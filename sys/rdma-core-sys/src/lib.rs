//! Bindings to rdma-core provider ABI.
