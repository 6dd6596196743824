//! Raw bindings to DPDK 22.11, generated at build time from the installed headers
//! (`pkg-config libdpdk`).
//!
//! DPDK's fast path (`rte_eth_rx_burst`, `rte_eth_tx_burst`, `rte_pktmbuf_alloc`,
//! `rte_pktmbuf_free`, `rte_ring_enqueue_burst`, ...) is `static inline` in the headers;
//! bindgen wraps each such function in a small C function compiled into this crate, so they
//! are callable here under their DPDK names. What DPDK offers only as a macro
//! (`rte_pktmbuf_mtod`, `rte_errno`) is provided as a function below.

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]
#![allow(unsafe_op_in_unsafe_fn)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// The calling thread's `rte_errno`.
pub fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local integer.
    unsafe { urdma_rte_errno() }
}

/// `rte_pktmbuf_mtod_offset`: pointer to the data of `m` at `off` bytes into its first segment.
///
/// # Safety
/// `m` must point to a valid mbuf.
#[inline]
pub unsafe fn rte_pktmbuf_mtod_offset<T>(m: *const rte_mbuf, off: usize) -> *mut T {
    ((*m).buf_addr as *mut u8).add((*m).data_off as usize + off) as *mut T
}

/// `rte_pktmbuf_mtod`: pointer to the start of the data of `m`.
///
/// # Safety
/// `m` must point to a valid mbuf.
#[inline]
pub unsafe fn rte_pktmbuf_mtod<T>(m: *const rte_mbuf) -> *mut T {
    rte_pktmbuf_mtod_offset(m, 0)
}

/// The error string DPDK has for `errnum` (an `rte_errno` or negative-errno value).
pub fn rte_strerror_string(errnum: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated string.
    unsafe {
        let p = rte_strerror(errnum.abs());
        if p.is_null() {
            return format!("error {errnum}");
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}
