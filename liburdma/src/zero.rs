//! All-zero values of the C structs the provider hands to libibverbs.
//!
//! libibverbs expects its command buffers and fresh objects zeroed before
//! it fills them in. Zeroing is only sound for types whose every field
//! accepts all-zero bytes, so it is offered only for types that say so by
//! implementing [`Zeroable`].

use rdma_core_sys::{
    ib_uverbs_alloc_mw_resp, ib_uverbs_alloc_pd_resp, ib_uverbs_create_srq_resp,
    ib_uverbs_ex_query_device_resp, ib_uverbs_reg_mr_resp, ibv_alloc_mw, ibv_alloc_pd,
    ibv_create_cq, ibv_create_qp, ibv_create_srq, ibv_modify_qp, ibv_modify_srq, ibv_mw, ibv_pd,
    ibv_qp_attr, ibv_query_port, ibv_query_qp, ibv_reg_mr, ibv_srq_attr, verbs_context_ops,
    verbs_mr,
};

/// A type of which all-zero bytes are a valid value.
///
/// # Safety
/// Implement only for types whose every field (recursively) is an integer,
/// a `bool`, a raw pointer, an `Option` of a function pointer, or an array,
/// union or `#[repr(C)]` struct of those. Never for a type holding a
/// reference, a `NonNull`, a `Box` or a Rust enum without a zero variant,
/// for which all-zero bytes are undefined behaviour.
pub(crate) unsafe trait Zeroable: Sized {}

/// The all-zero value of `T`.
pub(crate) const fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `T: Zeroable` promises all-zero bytes are a valid `T`.
    unsafe { std::mem::MaybeUninit::zeroed().assume_init() }
}

/// Declares bindgen-generated rdma-core structs [`Zeroable`].
macro_rules! zeroable_bindgen {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: a bindgen struct from rdma-core's C headers: its fields
        // are integers, raw pointers, `Option<extern fn>`, C enums (which
        // bindgen emits as integer constants), arrays, unions and nested
        // such structs, and the opaque pthread types are byte arrays. All
        // accept all-zero bytes, as C code relies on when it memsets them.
        unsafe impl Zeroable for $t {}
    )*};
}

zeroable_bindgen!(
    // Command and response buffers of the ibv_cmd_* helpers.
    ib_uverbs_ex_query_device_resp,
    ibv_query_port,
    ibv_alloc_pd,
    ib_uverbs_alloc_pd_resp,
    ibv_reg_mr,
    ib_uverbs_reg_mr_resp,
    ibv_create_cq,
    ibv_create_qp,
    ibv_modify_qp,
    ibv_qp_attr,
    ibv_query_qp,
    ibv_create_srq,
    ib_uverbs_create_srq_resp,
    ibv_modify_srq,
    ibv_srq_attr,
    ibv_alloc_mw,
    ib_uverbs_alloc_mw_resp,
    // Objects the provider allocates for libibverbs to fill in.
    ibv_pd,
    verbs_mr,
    ibv_mw,
    // The ops table: every verb left out is None.
    verbs_context_ops,
);
