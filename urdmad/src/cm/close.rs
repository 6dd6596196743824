//! Connected QPs and their owners: the control protocol's connection lines, disconnects,
//! and the end of a connection urdmad has to end itself.

use super::{connect_failed, kernel_msg, Action, Cm, ECONNRESET};
use crate::cm_channel::{Msg, Op};
use crate::proto::{ErrorCode, Request, Response};

impl Cm {
    pub(super) fn disconnect(&mut self, m: Msg) {
        let key = (m.dev, m.qpn);
        if let Some(hid) = self
            .handshakes
            .iter()
            .find(|(_, h)| (h.dev, h.qpn) == key)
            .map(|(&id, _)| id)
        {
            // Not connected yet: the handshake ends here.
            let h = self.handshakes.remove(&hid).expect("present");
            self.refresh_udp_ports();
            self.actions
                .push_back(connect_failed(hid, h.dev, h.qpn, ECONNRESET, Vec::new()));
            return;
        }
        let owner = self
            .conns
            .get(&key)
            .map(|c| c.client)
            .or_else(|| self.qps.get(&key).copied());
        match owner {
            Some(client) => self.actions.push_back(Action::Disconnect {
                client,
                dev: m.dev,
                qpn: m.qpn,
                status: m.status,
            }),
            None => self.abort_conn(key, ECONNRESET, false),
        }
    }

    /// The daemon could not write [`Action::Disconnect`] to its process: urdmad ends the
    /// connection itself. The process still has it, and reads its flow until it hears.
    pub fn disconnect_undelivered(&mut self, dev: u32, qpn: u32) {
        self.abort_conn((dev, qpn), ECONNRESET, true);
    }

    /// A destroyed QP whose connection finishes its graceful close in its process, on its
    /// flow, which stays open until the process closes it (`CLOSE`): the connection is no
    /// longer the QP's, and the kernel hears it closed (the close urdma.ko posted when the
    /// owner began it, if it did, makes this one a no-op).
    fn linger(&mut self, key: (u32, u32)) {
        let Some(c) = self.conns.remove(&key) else {
            return;
        };
        self.refresh_udp_ports();
        self.actions.push_back(kernel_msg(Op::Closed, |r| {
            r.dev = key.0;
            r.qpn = key.1;
            r.status = 0;
            r.local = c.local;
            r.remote = c.remote;
        }));
    }

    /// Ends a connection urdmad has to end itself: Abort to the peer, `CLOSED status` to the
    /// kernel, flow closed, or retired while `owner_reads` it (its process lives and has not
    /// let the QP go).
    pub(super) fn abort_conn(&mut self, key: (u32, u32), status: i32, owner_reads: bool) {
        let Some(c) = self.conns.remove(&key) else {
            return;
        };
        self.refresh_udp_ports();
        tracing::info!(dev = key.0, qpn = key.1, remote = %c.remote, "connection aborted");
        self.actions.push_back(Action::Abort {
            port: c.port,
            mac: c.mac,
            local: c.local,
            remote: c.remote,
            peer_conn: c.peer_conn,
            flow: c.flow,
        });
        self.counters.aborts_sent += 1;
        // The kernel first: the application waits for its DISCONNECTED, and closing the
        // flow (its rings, its filter) is urdmad's own business.
        self.actions.push_back(kernel_msg(Op::Closed, |r| {
            r.dev = key.0;
            r.qpn = key.1;
            r.status = status;
            r.local = c.local;
            r.remote = c.remote;
        }));
        if owner_reads {
            self.retired.insert(key, (c.client, c.flow));
            self.actions.push_back(Action::RetireFlow {
                client: c.client,
                flow: c.flow,
            });
        } else {
            self.actions.push_back(Action::CloseFlow {
                client: c.client,
                flow: c.flow,
            });
        }
    }

    /// The process let QP `key` go (`UNQP`, `QPCLOSED`): the flow of a connection urdmad
    /// ended under it is read no more. After a lingering close's `UNQP` the process closes
    /// the flow itself (`CLOSE`, its next line).
    fn let_go(&mut self, key: (u32, u32), client: u32, closes_it: bool) {
        if self.retired.get(&key).is_some_and(|&(c, _)| c == client) {
            let (_, flow) = self.retired.remove(&key).expect("present");
            if !closes_it {
                self.actions.push_back(Action::CloseFlow { client, flow });
            }
        }
    }

    /// urdma.ko named `client`'s process as the creator of QP `qpn` of device `dev`
    /// (`CONNECT`, `ACCEPT`): the QP is that process's, whatever a `QP` line said before.
    /// The kernel's word needs no line from the process, so creating a QP wakes nobody.
    pub fn kernel_owner(&mut self, dev: u32, qpn: u32, client: u32) {
        self.qps.insert((dev, qpn), client);
    }

    /// `client` no longer owns QP `key` (it said so, or the QP's connection ended); another
    /// process's entry stays.
    fn forget_qp(&mut self, key: (u32, u32), client: u32) {
        if self.qps.get(&key) == Some(&client) {
            self.qps.remove(&key);
        }
    }

    /// The process that owns QP `qpn` of device `dev`.
    pub fn qp_owner(&self, dev: u32, qpn: u32) -> Option<u32> {
        self.qps.get(&(dev, qpn)).copied()
    }

    /// A connection line of the control protocol (`QP`, `UNQP`, `QPCLOSED`, `PEERCLOSED`,
    /// `SYNC`) from `client`; the reply.
    pub fn client_request(&mut self, client: u32, req: &Request) -> Response {
        match *req {
            Request::Qp { dev, qpn } => {
                // A client's QPs go when it does (`client_gone`): another owner is alive.
                if let Some(&other) = self.qps.get(&(dev, qpn)) {
                    if other != client {
                        return Response::Error {
                            code: ErrorCode::Exists,
                            message: format!("QP {qpn} of device {dev} belongs to another process"),
                        };
                    }
                }
                self.qps.insert((dev, qpn), client);
            }
            Request::Unqp { dev, qpn, linger } => {
                self.forget_qp((dev, qpn), client);
                self.let_go((dev, qpn), client, linger);
                if self
                    .conns
                    .get(&(dev, qpn))
                    .is_some_and(|c| c.client == client)
                {
                    if linger {
                        self.linger((dev, qpn));
                    } else {
                        // The process destroyed the QP: it reads the flow no more.
                        self.abort_conn((dev, qpn), ECONNRESET, false);
                    }
                }
            }
            Request::QpClosed { dev, qpn, status } => {
                // Its connection is over, and the kernel names the owner again should the QP
                // connect once more: the process need not say when it destroys the QP.
                self.forget_qp((dev, qpn), client);
                self.let_go((dev, qpn), client, false);
                if self
                    .conns
                    .get(&(dev, qpn))
                    .is_none_or(|c| c.client != client)
                {
                    return Response::Ok;
                }
                let c = self.conns.remove(&(dev, qpn)).expect("present");
                self.refresh_udp_ports();
                // The kernel first, as in `abort_conn`.
                if !c.peer_closed_sent {
                    self.actions.push_back(kernel_msg(Op::PeerClosed, |r| {
                        r.dev = dev;
                        r.qpn = qpn;
                    }));
                }
                self.actions.push_back(kernel_msg(Op::Closed, |r| {
                    r.dev = dev;
                    r.qpn = qpn;
                    r.status = status.min(0);
                    r.local = c.local;
                    r.remote = c.remote;
                }));
                self.actions.push_back(Action::CloseFlow {
                    client,
                    flow: c.flow,
                });
            }
            Request::PeerClosed { dev, qpn } => {
                if let Some(c) = self.conns.get_mut(&(dev, qpn)) {
                    if c.client == client && !c.peer_closed_sent {
                        c.peer_closed_sent = true;
                        self.actions.push_back(kernel_msg(Op::PeerClosed, |r| {
                            r.dev = dev;
                            r.qpn = qpn;
                        }));
                    }
                }
            }
            _ => {}
        }
        Response::Ok
    }

    /// A process detached or went away: its QPs are forgotten and its connections end.
    pub fn client_gone(&mut self, client: u32) {
        self.qps.retain(|_, c| *c != client);
        // The daemon closes a process's flows, retired ones too, when it goes.
        self.retired.retain(|_, &mut (c, _)| c != client);
        let mine: Vec<(u32, u32)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.client == client)
            .map(|(&k, _)| k)
            .collect();
        for k in mine {
            self.abort_conn(k, ECONNRESET, false);
        }
    }
}
