//! The private structs (PABI 34) are not in Debian's headers, so their
//! layout is checked against the installed libibverbs itself: it builds a
//! context for a device of ours, takes an ops table through
//! `verbs_set_ops`, and its public entry points must then land in exactly
//! the functions we put in each slot, with the arguments the application
//! gave. A shifted field would call the wrong slot or pass a wrong size.

use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of, MaybeUninit};
use std::ptr::null_mut;
use std::sync::Mutex;

use rdma_core_sys::*;

static CALLS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn called(what: impl Into<String>) {
    CALLS.lock().unwrap().push(what.into());
}

fn take_calls() -> Vec<String> {
    std::mem::take(&mut *CALLS.lock().unwrap())
}

fn zeroed<T>() -> T {
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// A provider context with the verbs_context not at offset 0, as in real
/// providers, so the offset argument is exercised too.
#[repr(C)]
struct Wrapper {
    cookie: u64,
    vctx: verbs_context,
}

const COOKIE: u64 = 0x5552_444d_0000_0001;

unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    called("alloc_pd");
    let pd = Box::into_raw(Box::new(zeroed::<ibv_pd>()));
    unsafe { (*pd).handle = ctx as usize as u32 };
    pd
}
unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    called("dealloc_pd");
    drop(unsafe { Box::from_raw(pd) });
    101
}
unsafe extern "C" fn reg_mr(
    _pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    called(format!("reg_mr {len} {} {access}", iova == addr as u64));
    let vmr = Box::into_raw(Box::new(zeroed::<verbs_mr>()));
    unsafe { &raw mut (*vmr).ibv_mr }
}
unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> c_int {
    called("dereg_mr");
    drop(unsafe { Box::from_raw(vmr) });
    102
}
unsafe extern "C" fn create_cq(
    _ctx: *mut ibv_context,
    cqe: c_int,
    _ch: *mut ibv_comp_channel,
    vec: c_int,
) -> *mut ibv_cq {
    called(format!("create_cq {cqe} {vec}"));
    Box::into_raw(Box::new(zeroed::<ibv_cq>()))
}
unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    called("destroy_cq");
    drop(unsafe { Box::from_raw(cq) });
    103
}
unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    called(format!("create_qp {}", unsafe { (*attr).cap.max_send_sge }));
    // A provider fills in the QP (ibv_cmd_create_qp does); the library
    // then dispatches through qp->context.
    let qp = Box::into_raw(Box::new(zeroed::<ibv_qp>()));
    unsafe { (*qp).context = (*pd).context };
    qp
}
unsafe extern "C" fn modify_qp(_qp: *mut ibv_qp, _a: *mut ibv_qp_attr, mask: c_int) -> c_int {
    called(format!("modify_qp {mask}"));
    104
}
unsafe extern "C" fn query_qp(
    _qp: *mut ibv_qp,
    _a: *mut ibv_qp_attr,
    mask: c_int,
    _i: *mut ibv_qp_init_attr,
) -> c_int {
    called(format!("query_qp {mask}"));
    105
}
unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    called("destroy_qp");
    drop(unsafe { Box::from_raw(qp) });
    106
}
unsafe extern "C" fn query_device_ex(
    _ctx: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    called(format!("query_device_ex {size}"));
    unsafe { (*attr).orig_attr.max_qp = 4242 };
    0
}
unsafe extern "C" fn query_port(
    _ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    called(format!("query_port {port}"));
    unsafe { (*attr).state = IBV_PORT_ACTIVE };
    0
}
unsafe extern "C" fn poll_cq(_cq: *mut ibv_cq, _n: c_int, _wc: *mut ibv_wc) -> c_int {
    -1
}
unsafe extern "C" fn post_send(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    -2
}
unsafe extern "C" fn post_recv(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_recv_wr,
    _bad: *mut *mut ibv_recv_wr,
) -> c_int {
    -3
}
unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _s: c_int) -> c_int {
    -4
}
unsafe extern "C" fn free_context(ctx: *mut ibv_context) {
    called("free_context");
    let back = offset_of!(Wrapper, vctx) + offset_of!(verbs_context, context);
    let w = unsafe { ctx.cast::<u8>().sub(back).cast::<Wrapper>() };
    assert_eq!(unsafe { (*w).cookie }, COOKIE);
    unsafe {
        verbs_uninit_context(&raw mut (*w).vctx);
        libc_free(w.cast());
    }
}
unsafe extern "C" fn uninit_device(_dev: *mut verbs_device) {
    called("uninit_device");
}

unsafe extern "C" {
    #[link_name = "free"]
    fn libc_free(p: *mut c_void);
    #[link_name = "__errno_location"]
    fn errno_location() -> *mut c_int;
}

#[test]
fn libibverbs_dispatches_through_our_layout() {
    let dev_ops = Box::leak(Box::new(verbs_device_ops {
        uninit_device: Some(uninit_device),
        ..zeroed()
    }));
    let vdev = Box::leak(Box::new(zeroed::<verbs_device>()));
    vdev.ops = dev_ops;
    let ibdev = &raw mut vdev.device;

    let w = unsafe {
        verbs_init_and_alloc_context(
            ibdev,
            -1,
            size_of::<Wrapper>(),
            offset_of!(Wrapper, vctx),
            0,
        )
    }
    .cast::<Wrapper>();
    assert!(!w.is_null());
    let vctx = unsafe { &raw mut (*w).vctx };
    let ctx = unsafe { &raw mut (*vctx).context };
    unsafe { (*w).cookie = COOKIE };

    // What verbs_init_context wrote, read back through our offsets.
    unsafe {
        assert_eq!(
            (*vctx).sz,
            size_of::<verbs_context>(),
            "libibverbs' sizeof(verbs_context)"
        );
        assert_eq!((*ctx).device, ibdev);
        assert_eq!((*ctx).cmd_fd, -1);
        assert_eq!((*ctx).async_fd, -1);
        assert_eq!(
            (*ctx).abi_compat as usize,
            usize::MAX,
            "__VERBS_ABI_IS_EXTENDED"
        );
        assert!(!(*vctx).priv_.is_null());
        assert_eq!(vdev.refcount, 1, "verbs_device.refcount held once");
    }

    let ops = verbs_context_ops {
        alloc_pd: Some(alloc_pd),
        dealloc_pd: Some(dealloc_pd),
        reg_mr: Some(reg_mr),
        dereg_mr: Some(dereg_mr),
        create_cq: Some(create_cq),
        destroy_cq: Some(destroy_cq),
        create_qp: Some(create_qp),
        modify_qp: Some(modify_qp),
        query_qp: Some(query_qp),
        destroy_qp: Some(destroy_qp),
        query_device_ex: Some(query_device_ex),
        query_port: Some(query_port),
        poll_cq: Some(poll_cq),
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        req_notify_cq: Some(req_notify_cq),
        free_context: Some(free_context),
        ..zeroed()
    };
    unsafe { verbs_set_ops(vctx, &ops) };

    // The data-path ops are copied into the legacy table that verbs.h's
    // inline ibv_poll_cq()/ibv_post_send() call through.
    let legacy = unsafe { &(*ctx).ops };
    unsafe {
        assert_eq!(legacy.poll_cq.unwrap()(null_mut(), 0, null_mut()), -1);
        assert_eq!(
            legacy.post_send.unwrap()(null_mut(), null_mut(), null_mut()),
            -2
        );
        assert_eq!(
            legacy.post_recv.unwrap()(null_mut(), null_mut(), null_mut()),
            -3
        );
        assert_eq!(legacy.req_notify_cq.unwrap()(null_mut(), 0), -4);
    }

    unsafe {
        let mut attr: ibv_device_attr = zeroed();
        assert_eq!(ibv_query_device(ctx, &mut attr), 0);
        assert_eq!(attr.max_qp, 4242);
        let mut pattr: ibv_port_attr = zeroed();
        assert_eq!(
            ibv_query_port(ctx, 1, &mut pattr as *mut ibv_port_attr as *mut _),
            0
        );
        assert_eq!(pattr.state, IBV_PORT_ACTIVE);

        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null());
        assert_eq!((*pd).context, ctx, "libibverbs sets pd->context");

        let mut buf = vec![0u8; 8192];
        let mr = ibv_reg_mr(
            pd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            IBV_ACCESS_LOCAL_WRITE as c_int,
        );
        assert!(!mr.is_null());
        assert_eq!((*mr).pd, pd);
        assert_eq!((*mr).length, buf.len());

        let cookie = 0x1234usize as *mut c_void;
        let cq = ibv_create_cq(ctx, 77, cookie, null_mut(), 3);
        assert!(!cq.is_null());
        assert_eq!((*cq).context, ctx);
        assert_eq!((*cq).cq_context, cookie);

        let mut init: ibv_qp_init_attr = zeroed();
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_sge = 5;
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null());
        let mut qattr: ibv_qp_attr = zeroed();
        assert_eq!(ibv_modify_qp(qp, &mut qattr, IBV_QP_STATE as c_int), 104);
        assert_eq!(
            ibv_query_qp(qp, &mut qattr, IBV_QP_CAP as c_int, &mut init),
            105
        );

        // A verb we leave out is answered by libibverbs' own stub.
        let mut srq_attr: ibv_srq_init_attr = zeroed();
        *errno_location() = 0;
        assert!(ibv_create_srq(pd, &mut srq_attr).is_null());
        assert_eq!(*errno_location(), 95, "EOPNOTSUPP from the stub");

        assert_eq!(ibv_destroy_qp(qp), 106);
        assert_eq!(ibv_destroy_cq(cq), 103);
        assert_eq!(ibv_dereg_mr(mr), 102);
        assert_eq!(ibv_dealloc_pd(pd), 101);
        assert_eq!(ibv_close_device(ctx), 0);
    }

    let expected = [
        format!("query_device_ex {}", size_of::<ibv_device_attr>()),
        "query_port 1".into(),
        "alloc_pd".into(),
        format!("reg_mr 8192 true {}", IBV_ACCESS_LOCAL_WRITE),
        "create_cq 77 3".into(),
        "create_qp 5".into(),
        format!("modify_qp {}", IBV_QP_STATE),
        format!("query_qp {}", IBV_QP_CAP),
        "destroy_qp".into(),
        "destroy_cq".into(),
        "dereg_mr".into(),
        "dealloc_pd".into(),
        "free_context".into(),
        // The context held the only reference to the device.
        "uninit_device".into(),
    ];
    assert_eq!(take_calls(), expected);
}
