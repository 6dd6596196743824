//! Generates the DPDK bindings from the installed headers (`pkg-config libdpdk`) and compiles
//! bindgen's wrappers for DPDK's `static inline` functions, which are the whole fast path
//! (rx/tx burst, mbuf alloc/free, ring enqueue/dequeue) and have no symbol in the libraries.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config(args: &[&str]) -> Vec<String> {
    let tool = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let out = Command::new(&tool)
        .args(args)
        .arg("libdpdk")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool}: {e} (install pkg-config)"));
    if !out.status.success() {
        panic!(
            "`{tool} {} libdpdk` failed (install libdpdk-dev): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout)
        .expect("pkg-config output is not UTF-8")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Joins `-include X` into one element so the pair survives being handed around as a list.
fn cflags() -> Vec<String> {
    let raw = pkg_config(&["--cflags"]);
    let mut flags = Vec::new();
    let mut it = raw.into_iter();
    while let Some(f) = it.next() {
        if f == "-include" {
            if let Some(file) = it.next() {
                flags.push(format!("-include{file}"));
            }
        } else {
            flags.push(f);
        }
    }
    flags
}

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let csrc = manifest.join("csrc");
    let cflags = cflags();

    let static_fns = out.join("static_fns");
    let bindings = bindgen::Builder::default()
        .header(csrc.join("wrapper.h").to_string_lossy())
        .clang_args(&cflags)
        .clang_arg(format!("-I{}", csrc.display()))
        .allowlist_function("rte_.*|urdma_.*")
        .allowlist_type("rte_.*")
        .allowlist_var("RTE_.*|rte_.*|RING_F_.*|MEMPOOL_F_.*|MEMZONE_.*|SOCKET_ID_ANY")
        // Packed structs with aligned members that Rust cannot express; not needed.
        .opaque_type("rte_l2tpv2_combined_msg_hdr|rte_gtp_psc_.*|rte_arp_hdr|rte_arp_ipv4")
        // Bodies use SSE intrinsics or variadics that a wrapper cannot forward.
        .blocklist_function(
            ".*_vprintf|rte_vlog|rte_log_dump.*|rte_mov.*|rte_memcpy.*|rte_.*_vec.*",
        )
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&static_fns)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen failed on the DPDK headers");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");

    let mut build = cc::Build::new();
    build
        .file(static_fns.with_extension("c"))
        .file(csrc.join("helpers.c"))
        .include(&csrc)
        .include(&manifest)
        .warnings(false);
    for f in &cflags {
        if let Some(file) = f.strip_prefix("-include") {
            build.flag("-include").flag(file);
        } else if let Some(dir) = f.strip_prefix("-I") {
            build.include(dir);
        } else {
            build.flag(f);
        }
    }
    build.compile("dpdk_sys_wrappers");

    // How to link DPDK is the final artifact's choice, so no library is named for the
    // dependents here (`rustc-link-lib` would reach every one of them): `links` metadata
    // hands both ways to their build scripts (`DEP_RTE_EAL_DYNAMIC`, `DEP_RTE_EAL_STATIC`),
    // which pass them with `rustc-link-arg`, for their own targets only. This crate's own
    // test links dynamically.
    let dynamic = dynamic_args();
    for a in &dynamic {
        println!("cargo:rustc-link-arg={a}");
    }
    println!("cargo:dynamic={}", dynamic.join(" "));
    println!("cargo:static={}", SECONDARY_STATIC.join(" "));
}

/// The dynamic libraries and search paths of `pkg-config --libs libdpdk`, as linker
/// arguments. `--as-needed` is left out: it would drop libraries that only the wrappers (a
/// static archive) reference. A primary (urdmad) links these: the PMDs it drives are EAL
/// plugins, which EAL loads from DPDK's driver directory at start.
///
/// The ring mempool driver is linked too, although nothing calls it: loaded with the
/// program, it registers its operations before EAL loads the other plugins (in directory
/// order), so that they get the indices they get in a secondary linked with
/// [`SECONDARY_STATIC`], where that driver is the only one.
fn dynamic_args() -> Vec<String> {
    let mut args: Vec<String> = pkg_config(&["--libs"])
        .into_iter()
        .filter(|f| f.starts_with("-l") || f.starts_with("-L"))
        .collect();
    args.extend(
        [
            "-Wl,--no-as-needed",
            "-l:librte_mempool_ring.so.23",
            "-Wl,--as-needed",
        ]
        .map(String::from),
    );
    args
}

/// What a secondary (liburdma, inside an application) links instead: the few libraries it
/// uses, from their static archives, with their symbols kept out of the application's
/// namespace. A process linked to DPDK's shared EAL loads every one of DPDK's ~130 driver
/// plugins at `rte_eal_init` (EAL does so whenever it finds itself a shared library),
/// which took ~10 s per application under emulation and maps drivers (mlx5's among them,
/// with its own libibverbs provider) into every RDMA application. The statically linked
/// EAL loads none. The pool's operations come from the ring driver's archive, linked whole
/// for its constructor, which registers them; `urdma_shared::secondary` checks that the pool's
/// operations index names the same operations in both processes.
const SECONDARY_STATIC: &[&str] = &[
    "-Wl,--exclude-libs,ALL",
    "-Wl,--whole-archive",
    "-l:librte_mempool_ring.a",
    "-Wl,--no-whole-archive",
    "-l:librte_mempool.a",
    "-l:librte_ring.a",
    "-l:librte_eal.a",
    "-l:librte_telemetry.a",
    "-l:librte_kvargs.a",
    "-lnuma",
    "-lbsd",
    "-lfdt",
    "-lm",
];
