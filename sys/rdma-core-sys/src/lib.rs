//! Bindings to rdma-core's provider-private ABI, PABI 34: what a libibverbs
//! provider (`lib<name>-rdmav34.so`) hands to and receives from libibverbs
//! (`verbs_device_ops`, `verbs_context_ops`, `verbs_context`, the `ibv_cmd_*`
//! helpers, `verbs_register_driver_34`), plus the public `verbs.h`.
//!
//! Generated at build time from rdma-core v55 (PABI 34, like Debian's
//! rdma-core 44); `tests/layout.rs` checks the result against the installed
//! headers and library.

#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]
#![allow(unsafe_op_in_unsafe_fn)]
#![allow(rustdoc::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// rdma-core's `verbs_init_and_alloc_context()` macro: allocates the
/// provider's context struct of `size` bytes whose `verbs_context` member
/// sits at `offset`, and initialises that member.
///
/// # Safety
/// `device` must be the `ibv_device` libibverbs passed to `alloc_context`.
pub unsafe fn verbs_init_and_alloc_context(
    device: *mut ibv_device,
    cmd_fd: i32,
    size: usize,
    offset: usize,
    driver_id: u32,
) -> *mut core::ffi::c_void {
    _verbs_init_and_alloc_context(
        device,
        cmd_fd,
        size,
        offset as *mut verbs_context,
        driver_id,
    )
}
