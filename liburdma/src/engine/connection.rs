//! A QP's connection as the process lives it: the hand-over urdmad makes (`EVENT
//! CONNECTED`), the application's close and abort, the notices urdmad hears of its end, and
//! the ends that take every connection at once (urdmad gone, a fork).

use super::{flush, End, Engine, Flow, Notice, QpKey};
use crate::error::Error;
use trp::{
    Completion, ConnectOutcome, Connecting, Incoming, Instant, Queue, RecvWr, WcOpcode, WcStatus,
};
use urdma_shared::proto::{Connected, Role};

impl Engine {
    /// A notice as a connection would make it.
    #[cfg(test)]
    pub fn notice(&mut self, n: Notice) {
        self.notices.push(n);
    }

    /// QP `key`'s lingering close over, on flow `flow`, as [`Engine::linger`] ends one.
    #[cfg(test)]
    pub fn lingered(&mut self, key: QpKey, flow: u32) {
        self.lingered.push((key, flow));
    }

    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// Drops the flow of QP `key`'s ended connection, once its [`Notice::Closed`] is
    /// delivered.
    pub fn release_closed_flow(&mut self, key: QpKey) {
        if let Some(qp) = self.qps.get_mut(&key) {
            qp.closed_flow = None;
        }
    }

    /// `modify_qp` to SQD: graceful close of the connection.
    pub fn close(&mut self, key: QpKey) {
        if let Some(conn) = self.qps.get_mut(&key).and_then(|q| q.conn.as_mut()) {
            conn.close();
        }
    }

    /// The owner moved the connected QP to SQD, which urdma.ko takes as the connection's end
    /// for iw_cm (the application's `DISCONNECTED`): its `QPCLOSED` is [`Notice::Ended`].
    pub fn kernel_ended(&mut self, key: QpKey) {
        if let Some(qp) = self.qps.get_mut(&key).filter(|q| q.conn.is_some()) {
            qp.kernel_ended = true;
        }
    }

    /// Whether urdma.ko ended QP `key`'s connection for iw_cm ([`Engine::kernel_ended`]).
    pub fn is_kernel_ended(&self, key: QpKey) -> bool {
        self.qps.get(&key).is_some_and(|q| q.kernel_ended)
    }

    /// `n`, or [`Notice::Ended`] for a [`Notice::Closed`] whose QP's connection the kernel
    /// heard end since the notice was made.
    pub fn as_kernel_heard(&self, n: Notice) -> Notice {
        match n {
            Notice::Closed(key, status) if self.is_kernel_ended(key) => Notice::Ended(key, status),
            n => n,
        }
    }

    /// `modify_qp` to ERR (or an abortive `EVENT DISCONNECT`): abort the
    /// connection, or without one flush what was posted.
    pub fn abort(&mut self, key: QpKey, now: Instant) {
        let Some(qp) = self.qps.get_mut(&key) else {
            return;
        };
        match qp.conn.as_mut() {
            Some(conn) => conn.abort(now),
            None => {
                qp.errored = true;
                while let Some((wr_id, _)) = qp.early_recv.pop_front() {
                    qp.out.push_back(flush(wr_id, Queue::Recv, WcOpcode::Recv));
                }
            }
        }
    }

    /// `EVENT CONNECTED` (`h`, as urdmad handed the connection over):
    /// builds the QP's trp connection as docs/connection.md says, hands it
    /// the receives posted so far, and starts using `flow`.
    pub fn connected(
        &mut self,
        key: QpKey,
        h: &Connected,
        flow: Box<dyn Flow>,
        now: Instant,
    ) -> Result<(), Error> {
        let qp = self
            .qps
            .get_mut(&key)
            .ok_or(Error::HandOver("no such QP".into()))?;
        if qp.conn.is_some() {
            return Err(Error::HandOver("the QP is connected already".into()));
        }
        let cfg = trp::Config {
            pd: qp.init.pd,
            max_send_wr: qp.init.max_send_wr as usize,
            max_recv_wr: qp.init.max_recv_wr as usize,
            srq: qp.init.srq.is_some(),
            ..h.trp_config()
        };
        let conn = match h.role {
            Role::Active => {
                let c = Connecting::new(cfg, h.conn, h.isn, &h.pdata, now)?;
                match c.handle_datagram(now, &h.pkt) {
                    ConnectOutcome::Established { conn, .. } => conn,
                    _ => {
                        return Err(Error::HandOver(
                            "the Accept does not establish the connection".into(),
                        ))
                    }
                }
            }
            Role::Passive => {
                Incoming::parse(&h.pkt).and_then(|i| i.accept(cfg, h.conn, h.isn, &h.pdata))?
            }
        };
        let mut conn = conn;
        let inline = qp.inline_region();
        let mem = self.mrs.view(key.0, Some(key.1), inline, None);
        if h.role == Role::Passive && h.accept_sent {
            // urdmad sent this Accept, the same bytes, when it handed the connection over
            // (docs/connection.md): taken as sent here, repeated only while unacknowledged.
            let mut sent = vec![0u8; usize::from(h.datagram.max(trp::config::MIN_DATAGRAM))];
            let _ = conn.poll_transmit(now, &mem, &mut sent);
        }
        while let Some((wr_id, sges)) = qp.early_recv.pop_front() {
            if let Err(e) = conn.post_recv(&mem, &RecvWr { wr_id, sges: &sges }) {
                // Checked when posted; an MR deregistered since fails here.
                crate::log::error(format_args!("early receive {wr_id} refused: {e}"));
                qp.out.push_back(Completion {
                    status: WcStatus::LocalProtection,
                    ..flush(wr_id, Queue::Recv, WcOpcode::Recv)
                });
            }
        }
        if qp.errored {
            conn.abort(now);
        }
        let mut flow = flow;
        flow.events(
            self.cqs
                .get(&qp.init.recv_cq)
                .is_some_and(|c| c.has_channel()),
        );
        qp.conn = Some(conn);
        qp.flow = Some(flow);
        qp.flow_id = h.flow;
        Ok(())
    }

    /// urdmad went away: its rings are no longer ours. Every QP fails:
    /// connections are aborted (the Abort cannot be sent), everything
    /// posted is flushed. No notices: there is nobody to tell.
    pub fn fail_all(&mut self, now: Instant) {
        for qp in self.qps.values_mut() {
            qp.flow = None;
            qp.end = End::Told;
            match qp.conn.as_mut() {
                Some(c) => c.abort(now),
                None => {
                    qp.errored = true;
                    while let Some((wr_id, _)) = qp.early_recv.pop_front() {
                        qp.out.push_back(flush(wr_id, Queue::Recv, WcOpcode::Recv));
                    }
                }
            }
        }
        self.progress(now);
        self.notices.clear();
        self.lingering.clear();
        self.lingered.clear();
    }

    /// In the child of a fork(): every QP is the parent's, and its connection goes on in
    /// the parent. The child forgets them (a post on one fails with `EINVAL`) without
    /// touching what the parent shares with it; CQs, SRQs and the MR table stay, as copies
    /// over the child's own memory.
    pub fn forked(&mut self) {
        let mut qps = std::mem::take(&mut self.qps);
        for qp in qps.values_mut() {
            if let Some(f) = qp.flow.as_mut() {
                f.forked();
            }
        }
        drop(qps);
        for l in &mut self.lingering {
            if let Some(f) = l.qp.flow.as_mut() {
                f.forked();
            }
        }
        self.lingering.clear();
        self.lingered.clear();
        self.notices.clear();
        self.turn = None;
    }

    /// Stops using the flow of a QP (its connection is over for urdmad).
    pub fn drop_flow(&mut self, key: QpKey) {
        if let Some(q) = self.qps.get_mut(&key) {
            q.flow = None;
        }
    }
}
