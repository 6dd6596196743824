//! Sans-IO protocol core of urdma: RDMAP (RFC 5040, RFC 7306) over DDP
//! (RFC 5041) over TRP, a small reliability shim over UDP.
//!
//! Nothing here performs I/O or reads a clock. The caller feeds datagrams
//! and the current time in, and takes datagrams to send, completions and
//! the next timer deadline out. Memory is reached through [`mr::Memory`].

pub mod wire;
