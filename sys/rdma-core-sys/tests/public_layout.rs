//! The bindings come from rdma-core v55; the provider runs under Debian's
//! libibverbs 44. This compiles a probe against the installed
//! `<infiniband/verbs.h>` and compares every struct the provider shares with
//! libibverbs, field by field, with the generated Rust layout.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use rdma_core_sys::*;

struct Shape {
    name: &'static str,
    /// Whether the whole size must agree: false for structs the provider
    /// only passes through by pointer and that v55 grew at the end.
    size: Option<usize>,
    fields: Vec<(&'static str, usize)>,
}

macro_rules! shape {
    ($s:ident, size: $check:expr, [$($f:ident $(as $c:literal)?),* $(,)?]) => {
        Shape {
            name: stringify!($s),
            size: if $check { Some(size_of::<$s>()) } else { None },
            fields: vec![$((shape!(@name $f $(, $c)?), offset_of!($s, $f))),*],
        }
    };
    (@name $f:ident) => { stringify!($f) };
    (@name $f:ident, $c:literal) => { $c };
}

fn shapes() -> Vec<Shape> {
    vec![
        shape!(ibv_context, size: true, [device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat]),
        shape!(verbs_context, size: true, [
            query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
            create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
            modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
            modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
            post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
            create_wq, query_rt_values, create_cq_ex, priv_ as "priv", query_device_ex,
            ibv_destroy_flow, ibv_create_flow, open_qp, create_qp_ex, get_srq_num,
            create_srq_ex, open_xrcd, close_xrcd, sz, context,
        ]),
        shape!(ibv_context_ops, size: true, [
            _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
            _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
            _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
            _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
            _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
            _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
            _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
        ]),
        shape!(ibv_device, size: true, [_ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path]),
        shape!(ibv_pd, size: true, [context, handle]),
        shape!(ibv_mr, size: true, [context, pd, addr, length, handle, lkey, rkey]),
        shape!(ibv_cq, size: true, [
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed,
        ]),
        shape!(ibv_qp, size: true, [
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed,
        ]),
        shape!(ibv_comp_channel, size: true, [context, fd, refcnt]),
        shape!(ibv_qp_cap, size: true, [max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data]),
        shape!(ibv_qp_init_attr, size: true, [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all]),
        shape!(ibv_qp_attr, size: true, [
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
            en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
            port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit,
        ]),
        shape!(ibv_device_attr, size: true, [
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt,
        ]),
        shape!(ibv_device_attr_ex, size: true, [
            orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
            device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps,
            raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps,
            phys_port_cnt_ex,
        ]),
        // v55 appended active_speed_ex; the provider never allocates one.
        shape!(ibv_port_attr, size: false, [
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
            qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
            init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2,
        ]),
    ]
}

fn probe_source(shapes: &[Shape]) -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void)\n{\n",
    );
    for s in shapes {
        c.push_str(&format!(
            "\tprintf(\"{0} %zu\\n\", sizeof(struct {0}));\n",
            s.name
        ));
        for (f, _) in &s.fields {
            c.push_str(&format!(
                "\tprintf(\"{0}.{1} %zu\\n\", offsetof(struct {0}, {1}));\n",
                s.name, f
            ));
        }
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

fn installed_layout(shapes: &[Shape]) -> BTreeMap<String, usize> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("public_layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, probe_source(shapes)).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        out.status.success(),
        "probe against the installed verbs.h failed to compile (libibverbs-dev missing?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn shared_structs_match_installed_verbs_h() {
    let shapes = shapes();
    let c = installed_layout(&shapes);
    let mut wrong = Vec::new();
    for s in &shapes {
        if let Some(size) = s.size {
            if c[s.name] != size {
                wrong.push(format!("sizeof {}: C {} Rust {size}", s.name, c[s.name]));
            }
        }
        for (f, off) in &s.fields {
            let key = format!("{}.{f}", s.name);
            if c[&key] != *off {
                wrong.push(format!("offsetof {key}: C {} Rust {off}", c[&key]));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "layout differs from Debian's verbs.h:\n{}",
        wrong.join("\n")
    );
}
