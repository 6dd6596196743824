//! Brings EAL up without hugepages on a `net_null` vdev and moves packets through the
//! wrapped static-inline fast path. EAL can be initialised once per process, so this is a
//! binary of its own (harness = false) with a fixed sequence of checks.

use dpdk_sys::*;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::ptr;

const BURST: usize = 32;
const POOL_SIZE: u32 = 1023;

fn check(cond: bool, what: &str) {
    if !cond {
        eprintln!(
            "FAILED: {what} (rte_errno {})",
            rte_strerror_string(rte_errno())
        );
        std::process::exit(1);
    }
    println!("ok: {what}");
}

fn main() {
    let prefix = format!("urdma-sys-test-{}", std::process::id());
    let args = [
        "eal_null".to_string(),
        "--no-huge".into(),
        "--no-pci".into(),
        "-m".into(),
        "128".into(),
        "-l".into(),
        "0".into(),
        "--vdev=net_null0".into(),
        format!("--file-prefix={prefix}"),
        "--log-level=lib.eal:warning".into(),
    ];
    let cargs: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap())
        .collect();
    let mut argv: Vec<*mut c_char> = cargs.iter().map(|a| a.as_ptr() as *mut c_char).collect();

    unsafe {
        let rc = rte_eal_init(argv.len() as i32, argv.as_mut_ptr());
        check(rc >= 0, "rte_eal_init with --no-huge --vdev=net_null0");
        let result = std::panic::catch_unwind(|| run());
        rte_eal_cleanup();
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{prefix}"));
        if result.is_err() {
            std::process::exit(1);
        }
    }
    println!("all checks passed");
}

unsafe fn run() {
    let socket = rte_socket_id() as i32;
    let name = CString::new("eal_null_pool").unwrap();
    let pool = rte_pktmbuf_pool_create(
        name.as_ptr(),
        POOL_SIZE,
        0,
        0,
        RTE_MBUF_DEFAULT_BUF_SIZE as u16,
        socket,
    );
    check(!pool.is_null(), "rte_pktmbuf_pool_create");
    check(
        rte_mempool_avail_count(pool) == POOL_SIZE,
        "pool starts full",
    );

    let mut port: u16 = u16::MAX;
    let dev = CString::new("net_null0").unwrap();
    check(
        rte_eth_dev_get_port_by_name(dev.as_ptr(), &mut port) == 0,
        "net_null0 is a port",
    );
    let mut info: rte_eth_dev_info = Default::default();
    check(
        rte_eth_dev_info_get(port, &mut info) == 0,
        "rte_eth_dev_info_get",
    );
    let driver = CStr::from_ptr(info.driver_name).to_string_lossy();
    check(driver.contains("null"), "driver is net_null");

    let conf: rte_eth_conf = Default::default();
    check(
        rte_eth_dev_configure(port, 1, 1, &conf) == 0,
        "rte_eth_dev_configure",
    );
    check(
        rte_eth_rx_queue_setup(port, 0, 128, socket as u32, ptr::null(), pool) == 0,
        "rx queue setup",
    );
    check(
        rte_eth_tx_queue_setup(port, 0, 128, socket as u32, ptr::null()) == 0,
        "tx queue setup",
    );
    check(rte_eth_dev_start(port) == 0, "rte_eth_dev_start");

    // TX: fill mbufs through mtod and hand them to the PMD, which consumes and frees them.
    let mut tx: [*mut rte_mbuf; BURST] = [ptr::null_mut(); BURST];
    let mut fill_ok = true;
    for (i, slot) in tx.iter_mut().enumerate() {
        let m = rte_pktmbuf_alloc(pool);
        if m.is_null() {
            check(false, "rte_pktmbuf_alloc");
        }
        let data = rte_pktmbuf_append(m, 60) as *mut u8;
        if data.is_null() {
            check(false, "rte_pktmbuf_append");
        }
        fill_ok &= rte_pktmbuf_mtod::<u8>(m) == data;
        ptr::write_bytes(data, i as u8, 60);
        *slot = m;
    }
    check(true, "rte_pktmbuf_alloc and rte_pktmbuf_append, one burst");
    check(fill_ok, "rte_pktmbuf_mtod points at the appended data");
    check(
        rte_mempool_avail_count(pool) == POOL_SIZE - BURST as u32,
        "pool lent out one burst",
    );
    let sent = rte_eth_tx_burst(port, 0, tx.as_mut_ptr(), BURST as u16);
    check(
        sent as usize == BURST,
        "rte_eth_tx_burst sent the whole burst",
    );
    check(
        rte_mempool_avail_count(pool) == POOL_SIZE,
        "sent mbufs returned to the pool",
    );

    // RX: net_null produces frames of its default size (64 bytes) on every poll.
    let mut rx: [*mut rte_mbuf; BURST] = [ptr::null_mut(); BURST];
    let got = rte_eth_rx_burst(port, 0, rx.as_mut_ptr(), BURST as u16);
    check(got > 0, "rte_eth_rx_burst received packets");
    let mut sizes_ok = true;
    for &m in &rx[..got as usize] {
        sizes_ok &= (*m).pkt_len == 64;
        rte_pktmbuf_free(m);
    }
    check(sizes_ok, "received frames have net_null's size");
    check(
        rte_mempool_avail_count(pool) == POOL_SIZE,
        "rte_pktmbuf_free returned received mbufs",
    );

    let mut stats: rte_eth_stats = Default::default();
    check(
        rte_eth_stats_get(port, &mut stats) == 0,
        "rte_eth_stats_get",
    );
    check(
        stats.opackets == BURST as u64,
        "port counted the sent packets",
    );
    check(
        stats.ipackets == got as u64,
        "port counted the received packets",
    );

    // Ring: the static-inline enqueue/dequeue wrappers.
    let rname = CString::new("eal_null_ring").unwrap();
    let ring = rte_ring_create(rname.as_ptr(), 64, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
    check(!ring.is_null(), "rte_ring_create");
    let mut objs: [*mut std::ffi::c_void; 8] = [ptr::null_mut(); 8];
    for (i, o) in objs.iter_mut().enumerate() {
        *o = (i + 1) as *mut std::ffi::c_void;
    }
    let n = rte_ring_enqueue_burst(ring, objs.as_ptr(), 8, ptr::null_mut());
    check(n == 8, "rte_ring_enqueue_burst");
    check(rte_ring_count(ring) == 8, "rte_ring_count");
    let mut back: [*mut std::ffi::c_void; 8] = [ptr::null_mut(); 8];
    let n = rte_ring_dequeue_burst(ring, back.as_mut_ptr(), 8, ptr::null_mut());
    check(
        n == 8 && back == objs,
        "rte_ring_dequeue_burst returns in order",
    );
    rte_ring_free(ring);

    check(rte_eth_dev_stop(port) == 0, "rte_eth_dev_stop");
    check(rte_eth_dev_close(port) == 0, "rte_eth_dev_close");
    rte_mempool_free(pool);

    // rte_errno is a per-lcore variable, reachable only through the helper.
    const ENOENT: i32 = 2;
    urdma_rte_errno_set(ENOENT);
    check(rte_errno() == ENOENT, "rte_errno round-trips");
}
