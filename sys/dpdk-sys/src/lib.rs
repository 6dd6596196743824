//! Bindings to DPDK.
