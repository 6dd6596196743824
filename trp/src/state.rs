//! QP states. Connection setup is typed by value: `Connecting` and
//! `Incoming` are consumed into a `Connection`, so no data operation exists
//! before the handshake. Inside a `Connection` the state changes with
//! packets at run time; every change goes through [`Transition`], which is
//! implemented only for the edges below, so an invalid edge (say
//! `Error -> Rts`) does not compile.
//!
//! ```text
//! Rts -> Closing -> Closed
//!  \        \
//!   `-> Error -> Closed      (flushed)
//! ```

/// Run-time view of the state, for callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    Rts,
    Closing,
    Error,
    Closed,
}

pub trait State {
    const STATE: QpState;
}

pub struct Rts;
pub struct Closing;
pub struct Error;
pub struct Closed;

impl State for Rts {
    const STATE: QpState = QpState::Rts;
}
impl State for Closing {
    const STATE: QpState = QpState::Closing;
}
impl State for Error {
    const STATE: QpState = QpState::Error;
}
impl State for Closed {
    const STATE: QpState = QpState::Closed;
}

/// A legal edge from `Self` to `To`.
pub trait Transition<To: State>: State {}

impl Transition<Closing> for Rts {}
impl Transition<Error> for Rts {}
impl Transition<Error> for Closing {}
impl Transition<Closed> for Closing {}
impl Transition<Closed> for Error {}
