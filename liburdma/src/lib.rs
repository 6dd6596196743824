//! urdma's verbs provider, `liburdma-rdmav34.so`.
//!
//! libibverbs loads this library for a uverbs device that nothing else
//! claimed; a constructor registers [`device::DEVICE_OPS`], libibverbs asks
//! [`device`] whether a device is ours and then opens it through
//! [`context`]. Control verbs go through the kernel with the `ibv_cmd_*`
//! helpers ([`control_verbs`]); the data path runs in user space: the progress
//! [`engine`] drives trp connections over DPDK rings shared with urdmad,
//! or, on the direct path, over each connection's own packet socket,
//! places data through the process's MR table ([`mem`]) and completes
//! into user-space CQs ([`cq`]); shared receive queues keep their receives
//! in the engine too ([`srq`]).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod context;
pub mod control_verbs;
pub mod cq;
mod cq_ex;
mod data_verbs;
pub mod device;
mod dpdk;
pub mod engine;
pub mod error;
mod fork;
mod guard;
mod int_hash;
mod log;
pub mod mem;
mod mw;
mod process;
mod progress;
mod qp_ex;
mod qp_table;
mod socket_flow;
pub mod srq;
mod zero;

/// Registers the provider with libibverbs when the library is loaded.
///
/// libibverbs dlopen()s the provider and expects it to call
/// `verbs_register_driver_34` from a constructor; there is no exported
/// entry point to look up instead.
extern "C" fn register_provider() {
    guard::catch((), device::register);
}

#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER_PROVIDER: extern "C" fn() = register_provider;
