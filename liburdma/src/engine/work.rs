//! The application's data path into the engine: the work requests it posts to a QP or an
//! SRQ (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`) and the completions it polls
//! and waits for on a CQ (`ibv_poll_cq`, `ibv_req_notify_cq`). A part of
//! [`super::Engine`], kept apart from the QPs' life (creation, connection, close) and from
//! the rounds of progress: these calls move no datagram themselves; a request is checked
//! and queued, a completion taken from where a round put it.

use super::*;

impl Engine {
    pub fn post_send(&mut self, key: QpKey, wr: &SendReq<'_>) -> Result<(), Error> {
        let qp = self.qps.get_mut(&key).ok_or(Error::Invalid("no such QP"))?;
        if wr.sges.len() > qp.init.max_send_sge as usize && wr.inline.is_none() {
            return Err(Error::Invalid("more SGEs than the QP's max_send_sge"));
        }
        if qp.init.max_send_wr == 0 {
            return Err(Error::Post(PostError::QueueFull));
        }
        let signaled = wr.signaled || qp.init.sig_all;
        let op = wr.op.send_op();
        if qp.conn.is_none() {
            if qp.errored {
                qp.out
                    .push_back(flush(wr.wr_id, Queue::Send, op.wc_opcode()));
                return Ok(());
            }
            return Err(Error::NotConnected);
        }
        // Checked before trp queues the request, done once it has; refused
        // at once when it cannot be done, rather than failing the QP.
        let (pd, qpn) = (qp.init.pd, key.1);
        match wr.op {
            Work::Wire(_) => {}
            Work::Bind(b) => self.mrs.check_bind(key.0, pd, &b)?,
            Work::Invalidate(stag) => self
                .mrs
                .check_invalidate(key.0, Some(qpn), stag, pd)
                .map_err(|_| {
                    Error::Invalid("a local invalidate of an STag this QP may not invalidate")
                })?,
        }
        // A local request has no data: no scatter list, nothing inline.
        let (sges, inline) = match wr.op {
            Work::Wire(_) => (wr.sges, wr.inline),
            Work::Bind(_) | Work::Invalidate(_) => (&[][..], None),
        };
        let one;
        let sges = match inline {
            None => sges,
            Some(parts) => {
                if matches!(wr.op, Work::Wire(SendOp::RdmaRead { .. })) {
                    return Err(Error::Invalid("an RDMA Read cannot be inline"));
                }
                let max = qp.init.max_inline as usize;
                if parts.iter().map(|p| p.len()).sum::<usize>() > max {
                    return Err(Error::Invalid("inline data past the QP's max_inline_data"));
                }
                if qp.inline.is_none() {
                    qp.inline = InlineBuf::new(qp.init.max_send_wr as usize, max);
                }
                let ib = qp
                    .inline
                    .as_mut()
                    .ok_or(Error::Invalid("the QP has no inline buffer"))?;
                let (addr, len) = ib
                    .stage(parts.iter().copied())
                    .ok_or(Error::Invalid("no free slot in the QP's inline buffer"))?;
                one = [Sge {
                    addr,
                    len,
                    lkey: INLINE_STAG,
                }];
                &one[..]
            }
        };
        let inline = qp.inline_region();
        let conn = qp.conn.as_mut().expect("checked above");
        let mem = self.mrs.view(key.0, Some(qpn), inline, None);
        conn.post_send(
            &mem,
            &SendWr {
                wr_id: wr.wr_id,
                op,
                sges,
                signaled,
            },
        )?;
        match &wr.op {
            Work::Bind(b) => self.mrs.bind(key.0, qpn, b),
            Work::Invalidate(stag) => {
                // Checked above, with the table unchanged since.
                let _ = self.mrs.invalidate(key.0, Some(qpn), *stag, pd);
            }
            Work::Wire(_) if wr.inline.is_some() => {
                if let Some(ib) = qp.inline.as_mut() {
                    ib.commit();
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// How many send requests QP `key`'s connection takes now (None: no
    /// connection, or no such QP).
    pub fn send_room(&self, key: QpKey) -> Option<usize> {
        self.qps
            .get(&key)?
            .conn
            .as_ref()
            .map(|c| c.send_queue_room())
    }

    pub fn post_recv(&mut self, key: QpKey, wr_id: u64, sges: &[Sge]) -> Result<(), Error> {
        let qp = self.qps.get_mut(&key).ok_or(Error::Invalid("no such QP"))?;
        if sges.len() > qp.init.max_recv_sge as usize {
            return Err(Error::Invalid("more SGEs than the QP's max_recv_sge"));
        }
        if qp.init.srq.is_some() {
            return Err(Error::Invalid(
                "a QP on an SRQ takes its receives from the SRQ",
            ));
        }
        if qp.init.max_recv_wr == 0 {
            return Err(Error::Post(PostError::QueueFull));
        }
        let inline = qp.inline_region();
        let mem = self.mrs.view(key.0, Some(key.1), inline, None);
        match qp.conn.as_mut() {
            Some(conn) => {
                conn.post_recv(&mem, &RecvWr { wr_id, sges })?;
                if let Some(f) = qp.flow.as_mut() {
                    f.ring_for(conn.bell_psn());
                }
                Ok(())
            }
            None if qp.errored => {
                qp.out.push_back(flush(wr_id, Queue::Recv, WcOpcode::Recv));
                Ok(())
            }
            None => {
                if qp.early_recv.len() >= qp.init.max_recv_wr as usize {
                    return Err(Error::Post(PostError::QueueFull));
                }
                let mut total = 0u64;
                for s in sges {
                    check(
                        &mem,
                        s.lkey,
                        qp.init.pd,
                        s.addr,
                        u64::from(s.len),
                        Access::LOCAL_WRITE,
                    )
                    .map_err(|e| Error::Post(PostError::LocalProtection(e)))?;
                    total += u64::from(s.len);
                }
                if total > 1 << 31 {
                    return Err(Error::Post(PostError::TooLong));
                }
                qp.early_recv.push_back((wr_id, sges.to_vec()));
                Ok(())
            }
        }
    }

    pub fn post_srq_recv(&mut self, key: SrqKey, wr_id: u64, sges: &[Sge]) -> Result<(), Error> {
        let (dev, srq) = self
            .srqs
            .get_mut(&key)
            .ok_or(Error::Invalid("no such SRQ"))?;
        let mem = self.mrs.view(*dev, None, None, None);
        Ok(srq.post(&mem, &RecvWr { wr_id, sges })?)
    }

    /// `ibv_poll_cq` at `now`: a receive completion taken starts the last stretch of its
    /// connection's held ACK ([`trp::Connection::reader_saw`]).
    pub fn poll_cq(
        &mut self,
        key: CqKey,
        out: &mut [rdma_core_sys::ibv_wc],
        now: Instant,
    ) -> Option<usize> {
        let n = self.cqs.get_mut(&key)?.poll(out);
        for wc in &out[..n] {
            if wc.opcode & rdma_core_sys::IBV_WC_RECV != 0 {
                if let Some(qp) = self.qps.get_mut(&(key.0, wc.qp_num)) {
                    if let Some(conn) = qp.conn.as_mut() {
                        conn.reader_saw(now);
                        qp.reply.read(now);
                    }
                }
            }
        }
        Some(n)
    }

    /// The application posted a request to QP `key` at `now`: if it answers a receive it
    /// read, the ACK of its next receives waits as long as its answers take
    /// ([`reply::ReplyTime`]).
    pub fn request_posted(&mut self, key: QpKey, now: Instant) {
        if let Some(qp) = self.qps.get_mut(&key) {
            if let Some(conn) = qp.conn.as_mut() {
                if let Some(hold) = qp.reply.posted(now, conn.reader_bound()) {
                    conn.set_ack_hold(hold);
                }
            }
        }
    }

    pub fn arm_cq(&mut self, key: CqKey, solicited_only: bool) -> bool {
        match self.cqs.get_mut(&key) {
            Some(cq) => {
                cq.arm(solicited_only);
                true
            }
            None => false,
        }
    }
}
