//! Packets per second through urdmad's software demultiplexing into 1, 8 and 64 per-flow
//! rings, as a ratio to a bare rte_ring forwarding loop measured in the same run.
//!
//! Every variant recycles the same prebuilt frames (4096 frames of 106 bytes, in mbufs of
//! one pool): source ring -> stage -> consumer -> source ring. Only the stage, which is what
//! urdmad's polling loop does per burst, is timed (TSC around each burst):
//! - bare: dequeue a burst from the source ring, enqueue it on one ring;
//! - bare reading headers: the same, also reading one header byte of each frame, which any
//!   forwarder that looks at packets must do (frames are cold in cache, as from a NIC);
//! - demux: dequeue a burst, `FlowTable::dispatch` (parse Ethernet/IPv4/UDP, look the flow
//!   up, enqueue on the flow's ring), frames addressed round-robin to the flows.
//!
//! The consumer (the processes' side) is not timed. No NIC is involved. Each figure is the
//! best of several interleaved runs.
//! Run: `cargo bench -p urdmad --bench demux`.

use dpdk_sys as sys;
use std::ffi::{c_void, CString};
use std::net::SocketAddrV4;
use std::os::raw::c_char;
use std::ptr;
use std::time::{Duration, Instant};
use urdmad::demux::FlowTable;
use urdmad::frame::udp_frame;

const BURST: usize = 32;
const FRAMES: u32 = 4096;
const RING: u32 = 8192;
const RUN: Duration = Duration::from_millis(300);
/// Each figure is the best of this many interleaved runs: the machines are shared, and
/// interference only ever makes a run slower.
const REPEAT: usize = 7;

fn ring(name: &str) -> *mut sys::rte_ring {
    let c = CString::new(name).unwrap();
    // SAFETY: EAL is up; valid name.
    let r = unsafe {
        sys::rte_ring_create(
            c.as_ptr(),
            RING,
            sys::SOCKET_ID_ANY,
            sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ,
        )
    };
    assert!(!r.is_null(), "ring {name}");
    r
}

/// Fills `src` with frames addressed round-robin to `flows` UDP ports.
unsafe fn fill(pool: *mut sys::rte_mempool, src: *mut sys::rte_ring, flows: u16) {
    for i in 0..FRAMES {
        let m = sys::rte_pktmbuf_alloc(pool);
        assert!(!m.is_null());
        let port = 10_000 + (i as u16 % flows);
        let f = udp_frame(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            "10.0.0.2:4000".parse().unwrap(),
            SocketAddrV4::new([10, 0, 0, 1].into(), port),
            &[0u8; 64],
        );
        let d = sys::rte_pktmbuf_append(m, f.len() as u16) as *mut u8;
        ptr::copy_nonoverlapping(f.as_ptr(), d, f.len());
        assert_eq!(sys::rte_ring_sp_enqueue(src, m as *mut c_void), 0);
    }
}

unsafe fn empty(src: *mut sys::rte_ring) {
    let mut objs = [ptr::null_mut::<c_void>(); BURST];
    loop {
        let n =
            sys::rte_ring_sc_dequeue_burst(src, objs.as_mut_ptr(), BURST as u32, ptr::null_mut());
        if n == 0 {
            break;
        }
        for &o in &objs[..n as usize] {
            sys::rte_pktmbuf_free(o as *mut sys::rte_mbuf);
        }
    }
}

/// Moves everything on `from` back to `src` (the untimed consumer).
unsafe fn give_back(from: *mut sys::rte_ring, src: *mut sys::rte_ring) {
    let mut objs = [ptr::null_mut::<c_void>(); BURST];
    loop {
        let n =
            sys::rte_ring_sc_dequeue_burst(from, objs.as_mut_ptr(), BURST as u32, ptr::null_mut());
        if n == 0 {
            break;
        }
        sys::rte_ring_sp_enqueue_burst(src, objs.as_ptr(), n, ptr::null_mut());
    }
}

/// Runs `stage` (which returns how many packets it moved) until [`RUN`] has passed, then
/// `consume`; returns packets per second of stage time.
unsafe fn measure(mut stage: impl FnMut() -> u32, mut consume: impl FnMut()) -> f64 {
    let hz = sys::rte_get_tsc_hz() as f64;
    let mut cycles = 0u64;
    let mut packets = 0u64;
    let start = Instant::now();
    while start.elapsed() < RUN {
        for _ in 0..64 {
            let t0 = sys::rte_rdtsc();
            let n = stage();
            cycles += sys::rte_rdtsc() - t0;
            packets += u64::from(n);
        }
        consume();
    }
    packets as f64 * hz / cycles as f64
}

unsafe fn bare(src: *mut sys::rte_ring, mid: *mut sys::rte_ring, touch: bool) -> f64 {
    let mut objs = [ptr::null_mut::<c_void>(); BURST];
    let mut sum = 0u8;
    let pps = measure(
        || {
            let n = sys::rte_ring_sc_dequeue_burst(
                src,
                objs.as_mut_ptr(),
                BURST as u32,
                ptr::null_mut(),
            );
            if touch {
                for &o in &objs[..n as usize] {
                    let d = sys::rte_pktmbuf_mtod::<u8>(o as *const sys::rte_mbuf);
                    sum = sum.wrapping_add(ptr::read_volatile(d.add(37)));
                }
            }
            sys::rte_ring_sp_enqueue_burst(mid, objs.as_ptr(), n, ptr::null_mut())
        },
        || give_back(mid, src),
    );
    std::hint::black_box(sum);
    pps
}

unsafe fn demux(src: *mut sys::rte_ring, flows: u16) -> f64 {
    let mut table = FlowTable::default();
    let rings: Vec<*mut sys::rte_ring> = (0..flows)
        .map(|i| ring(&format!("bench_{flows}_{i}")))
        .collect();
    for (i, &r) in rings.iter().enumerate() {
        table
            .insert(
                SocketAddrV4::new([10, 0, 0, 1].into(), 10_000 + i as u16),
                None,
                r,
            )
            .unwrap();
    }
    let mut objs = [ptr::null_mut::<c_void>(); BURST];
    let mut kernel = Vec::with_capacity(BURST);
    let table = std::cell::RefCell::new(table);
    let pps = measure(
        || {
            let n = sys::rte_ring_sc_dequeue_burst(
                src,
                objs.as_mut_ptr(),
                BURST as u32,
                ptr::null_mut(),
            );
            let burst =
                std::slice::from_raw_parts(objs.as_ptr() as *const *mut sys::rte_mbuf, n as usize);
            kernel.clear();
            table.borrow_mut().dispatch(burst, &mut kernel);
            n - kernel.len() as u32
        },
        || {
            for &r in &rings {
                give_back(r, src);
            }
        },
    );
    let mut table = table.into_inner();
    assert_eq!(
        table.get(0).map(|f| f.drops),
        Some(0),
        "flow rings overflowed"
    );
    for (i, r) in rings.into_iter().enumerate() {
        table.remove(i as u32);
        empty(r);
        sys::rte_ring_free(r);
    }
    pps
}

fn main() {
    let prefix = format!("urdbench{}", std::process::id());
    let args = [
        "demux-bench".to_string(),
        "--no-huge".into(),
        "--no-pci".into(),
        "-m".into(),
        "256".into(),
        "-l".into(),
        "0".into(),
        format!("--file-prefix={prefix}"),
        "--log-level=3".into(),
    ];
    let c: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap())
        .collect();
    let mut argv: Vec<*mut c_char> = c.iter().map(|a| a.as_ptr() as *mut c_char).collect();
    // SAFETY: single-threaded use of DPDK after a successful EAL initialisation.
    unsafe {
        assert!(
            sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) >= 0,
            "EAL"
        );
        let name = CString::new("bench_pool").unwrap();
        let pool = sys::rte_pktmbuf_pool_create(
            name.as_ptr(),
            8191,
            256,
            0,
            sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
            sys::SOCKET_ID_ANY,
        );
        assert!(!pool.is_null());
        let src = ring("bench_src");
        let mid = ring("bench_mid");
        println!("| flows | bare ring Mpps | bare ring reading headers Mpps | demux Mpps | demux / bare | demux / bare reading headers |");
        println!("|---:|---:|---:|---:|---:|---:|");
        for flows in [1u16, 8, 64] {
            fill(pool, src, flows);
            let (mut base, mut touch, mut d) = (0f64, 0f64, 0f64);
            for _ in 0..REPEAT {
                base = base.max(bare(src, mid, false));
                touch = touch.max(bare(src, mid, true));
                d = d.max(demux(src, flows));
            }
            empty(src);
            println!(
                "| {flows} | {:.1} | {:.1} | {:.1} | {:.3} | {:.2} |",
                base / 1e6,
                touch / 1e6,
                d / 1e6,
                d / base,
                d / touch
            );
        }
        sys::rte_ring_free(src);
        sys::rte_ring_free(mid);
        sys::rte_mempool_free(pool);
        sys::rte_eal_cleanup();
    }
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{prefix}"));
}
