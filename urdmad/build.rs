//! Generates the Rust view of `struct urdma_cm_msg` (the
//! /dev/urdma_cm messages) from the header urdma.ko compiles too, kmod/urdma-abi.h.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // urdmad and its tests link DPDK's shared libraries: it is the primary, and the PMDs it
    // drives are plugins of the shared EAL (sys/dpdk-sys/build.rs).
    if let Ok(args) = std::env::var("DEP_RTE_EAL_DYNAMIC") {
        for a in args.split_whitespace() {
            println!("cargo:rustc-link-arg={a}");
        }
    }
    generate();
}

fn generate() {
    use std::env;
    use std::path::PathBuf;
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let header = manifest.join("..").join("kmod").join("urdma-abi.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("urdma_(cm_.*|stat|bell_verdict)")
        .allowlist_var("URDMA_CM_.*")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on kmod/urdma-abi.h")
        .write_to_file(out.join("urdma_cm_abi.rs"))
        .expect("write urdma_cm_abi.rs");
}
