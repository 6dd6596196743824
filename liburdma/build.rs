//! Generates the Rust view of the kernel <-> provider ABI from the one
//! header that urdma.ko compiles too (kmod/urdma-abi.h).

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let header = manifest.join("..").join("kmod").join("urdma-abi.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=build.rs");
    // The provider lives inside applications: it links the few DPDK libraries a secondary
    // needs statically, hidden from the application (sys/dpdk-sys/build.rs says why).
    let static_args = env::var("DEP_RTE_EAL_STATIC").expect("dpdk-sys's link arguments");
    for a in static_args.split_whitespace() {
        println!("cargo:rustc-link-arg={a}");
    }

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("urdma_.*")
        .allowlist_var("URDMA_.*")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on kmod/urdma-abi.h")
        .write_to_file(out.join("urdma_abi.rs"))
        .expect("write urdma_abi.rs");
}
