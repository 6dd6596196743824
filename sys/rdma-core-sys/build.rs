//! Generates the PABI 34 bindings from the rdma-core v55 tree that the
//! crates.io package `ibverbs-sys` 0.3.2+55.0 carries under `vendor/rdma-core`.
//!
//! rdma-core's own build (cmake) would first publish its headers into a
//! `build/include` tree, generate `config.h` and rewrite the kernel ABI
//! header into `kernel-abi/`. Only those three steps are needed for the
//! headers to parse, so they are done here, in `OUT_DIR`, without cmake.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "pabi.rs"]
mod pabi;

/// The private ABI the bindings are for; a provider is `lib<name>-rdmav34.so`.
const PABI: &str = "34";
const SOURCE_PACKAGE: &str = "ibverbs-sys-0.3.2+55.0";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RDMA_CORE_SRC");
    println!("cargo:rustc-link-lib=dylib=ibverbs");

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src = rdma_core_source();
    check_pabi(&src);
    check_installed_pabi();

    let include = out.join("include");
    stage_headers(&src, &include);

    let wrapper = out.join("wrapper.h");
    write_if_changed(
        &wrapper,
        b"#include <infiniband/verbs.h>\n#include <infiniband/driver.h>\n#include <infiniband/kern-abi.h>\n",
    );

    let bindings = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-I{}", src.display()))
        .allowlist_type("verbs_.*")
        .allowlist_type("ibv_.*")
        .allowlist_type("ib_uverbs_.*")
        .allowlist_type("rdma_driver_id")
        .allowlist_var("IBV_.*")
        .allowlist_var("VERBS_.*")
        .allowlist_var("RDMA_DRIVER_.*")
        .allowlist_var("IB_UVERBS_.*")
        // Only functions that Debian's libibverbs 44 really exports
        // (a symbol missing there would make the provider fail to load).
        .allowlist_function("verbs_register_driver_34")
        .allowlist_function("_verbs_init_and_alloc_context")
        .allowlist_function("verbs_uninit_context")
        .allowlist_function("verbs_set_ops")
        .allowlist_function("__verbs_log")
        .allowlist_function("ibv_cmd_get_context")
        .allowlist_function("ibv_cmd_query_device_any")
        .allowlist_function("ibv_cmd_query_port")
        .allowlist_function("ibv_cmd_alloc_pd")
        .allowlist_function("ibv_cmd_dealloc_pd")
        .allowlist_function("ibv_cmd_reg_mr")
        .allowlist_function("ibv_cmd_dereg_mr")
        .allowlist_function("ibv_cmd_alloc_mw")
        .allowlist_function("ibv_cmd_dealloc_mw")
        .allowlist_function("ibv_cmd_create_cq")
        .allowlist_function("ibv_cmd_destroy_cq")
        .allowlist_function("ibv_cmd_create_qp")
        .allowlist_function("ibv_cmd_modify_qp")
        .allowlist_function("ibv_cmd_query_qp")
        .allowlist_function("ibv_cmd_destroy_qp")
        .allowlist_function("ibv_cmd_create_srq")
        .allowlist_function("ibv_cmd_modify_srq")
        .allowlist_function("ibv_cmd_destroy_srq")
        // Public entry points, used by tests that drive the real library.
        .allowlist_function("ibv_get_device_list")
        .allowlist_function("ibv_free_device_list")
        .allowlist_function("ibv_get_device_name")
        .allowlist_function("ibv_open_device")
        .allowlist_function("ibv_close_device")
        .allowlist_function("ibv_alloc_pd")
        .allowlist_function("ibv_dealloc_pd")
        .allowlist_function("ibv_reg_mr")
        .allowlist_function("ibv_dereg_mr")
        .allowlist_function("ibv_create_cq")
        .allowlist_function("ibv_destroy_cq")
        .allowlist_function("ibv_create_qp")
        .allowlist_function("ibv_destroy_qp")
        .allowlist_function("ibv_modify_qp")
        .allowlist_function("ibv_query_qp")
        .allowlist_function("ibv_query_device")
        .allowlist_function("ibv_query_port")
        .allowlist_function("ibv_create_comp_channel")
        .allowlist_function("ibv_destroy_comp_channel")
        .allowlist_function("ibv_alloc_mw")
        .allowlist_function("ibv_qp_to_qp_ex")
        .allowlist_function("ibv_create_srq")
        .allowlist_function("ibv_create_ah")
        // libibverbs locks these with its own pthread mutexes; Rust only
        // moves pointers to them.
        .allowlist_type("pthread_(mutex|cond)_t")
        .opaque_type("pthread_.*")
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(RerunOnSources {
            staged: out.clone(),
        }))
        .generate()
        .expect("bindgen failed on rdma-core's driver.h");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}

/// Asks cargo to rerun this script when a header bindgen read changes, except the ones this
/// script staged in OUT_DIR: cargo dates a script's run from its start, so files it writes
/// look newer than the run and would make the next build, and everything after it, redo
/// the bindings once more.  Their sources are watched by `copy` instead.
#[derive(Debug)]
struct RerunOnSources {
    staged: PathBuf,
}

impl bindgen::callbacks::ParseCallbacks for RerunOnSources {
    fn include_file(&self, filename: &str) {
        if !Path::new(filename).starts_with(&self.staged) {
            println!("cargo:rerun-if-changed={filename}");
        }
    }
}

/// Finds rdma-core v55: `RDMA_CORE_SRC` if set, else the pinned crates.io
/// package in the cargo registry, fetching it on first use. A plain
/// `cargo build` downloads only what it compiles, and this package is never
/// compiled (see Cargo.toml), so the first build has to fetch it itself.
fn rdma_core_source() -> PathBuf {
    if let Some(dir) = env::var_os("RDMA_CORE_SRC") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = find_in_registry() {
        return dir;
    }
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest =
        Path::new(&env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir")).join("Cargo.toml");
    let status = Command::new(cargo)
        .arg("fetch")
        .arg("--manifest-path")
        .arg(&manifest)
        .status()
        .expect("run cargo fetch");
    assert!(status.success(), "cargo fetch failed ({status})");
    find_in_registry().unwrap_or_else(|| {
        panic!(
            "{SOURCE_PACKAGE} is not in the cargo registry after `cargo fetch`; \
             set RDMA_CORE_SRC to an rdma-core v55 source tree"
        )
    })
}

fn cargo_home() -> PathBuf {
    if let Some(home) = env::var_os("CARGO_HOME") {
        return PathBuf::from(home);
    }
    PathBuf::from(env::var_os("HOME").expect("HOME or CARGO_HOME")).join(".cargo")
}

fn find_in_registry() -> Option<PathBuf> {
    let registries = fs::read_dir(cargo_home().join("registry").join("src")).ok()?;
    registries
        .flatten()
        .map(|r| {
            r.path()
                .join(SOURCE_PACKAGE)
                .join("vendor")
                .join("rdma-core")
        })
        .find(|p| p.join("libibverbs").join("driver.h").is_file())
}

/// The tree must really be PABI 34: the bindings would silently describe
/// another ABI otherwise.
fn check_pabi(src: &Path) {
    let cmake = fs::read_to_string(src.join("CMakeLists.txt")).expect("rdma-core CMakeLists.txt");
    let declared = cmake
        .lines()
        .find_map(|l| l.trim().strip_prefix("set(IBVERBS_PABI_VERSION "))
        .map(|v| v.trim_end_matches(')').trim_matches('"').to_string());
    assert_eq!(
        declared.as_deref(),
        Some(PABI),
        "{} is not an rdma-core tree with PABI {PABI}",
        src.display()
    );
}

/// The installed libibverbs must speak the same PABI, or it would never load the provider
/// (pabi.rs): stop the build with one line saying so.
fn check_installed_pabi() {
    println!("cargo:rerun-if-env-changed=URDMA_LIBIBVERBS");
    let Some(lib) = pabi::installed() else {
        println!("cargo:warning=no installed libibverbs.so.1 found to check its provider ABI");
        return;
    };
    println!("cargo:rerun-if-changed={}", lib.display());
    let want = PABI.parse().expect("PABI is a number");
    if let Err(e) = pabi::check(&lib, want) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Lays out the include tree that rdma-core's cmake would publish.
fn stage_headers(src: &Path, include: &Path) {
    for dir in ["infiniband", "rdma", "kernel-abi"] {
        fs::create_dir_all(include.join(dir)).expect("create include dir");
    }
    for h in [
        "verbs.h",
        "verbs_api.h",
        "driver.h",
        "kern-abi.h",
        "cmd_ioctl.h",
        "cmd_write.h",
        "opcode.h",
        "arch.h",
        "tm_types.h",
    ] {
        copy(
            &src.join("libibverbs").join(h),
            &include.join("infiniband").join(h),
        );
    }
    let kernel = src.join("kernel-headers").join("rdma");
    for entry in fs::read_dir(&kernel)
        .expect("kernel-headers/rdma")
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "h") {
            copy(&path, &include.join("rdma").join(entry.file_name()));
        }
    }
    copy(
        &kernel.join("ib_user_ioctl_verbs.h"),
        &include.join("infiniband").join("ib_user_ioctl_verbs.h"),
    );

    let uverbs = fs::read_to_string(kernel.join("ib_user_verbs.h")).expect("ib_user_verbs.h");
    write_if_changed(
        &include.join("kernel-abi").join("ib_user_verbs.h"),
        struct_bodies_as_macros(&uverbs).as_bytes(),
    );

    write_if_changed(&include.join("config.h"), CONFIG_H.as_bytes());
}

fn copy(from: &Path, to: &Path) {
    println!("cargo:rerun-if-changed={}", from.display());
    let bytes = fs::read(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
    write_if_changed(to, &bytes);
}

/// bindgen asks cargo to rerun this script when any header it read changes, the staged
/// ones in OUT_DIR included: rewriting them with new mtimes on every run would make every
/// build rebuild the bindings and all that depends on them.
fn write_if_changed(to: &Path, bytes: &[u8]) {
    if fs::read(to).is_ok_and(|old| old == bytes) {
        return;
    }
    fs::write(to, bytes).unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
}

/// rdma-core embeds each kernel command struct into its own, longer command
/// structs through a `_STRUCT_<name>` macro holding the struct's body. This
/// produces those macros from the kernel header: every top-level
/// `struct x {` ... `};` becomes `#define _STRUCT_x struct { ... }`.
fn struct_bodies_as_macros(header: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for line in strip_comments(header).lines() {
        let line = line.trim();
        if depth == 0 {
            let Some(name) = top_level_struct_name(line) else {
                continue;
            };
            let keyword = line.split_whitespace().next().unwrap_or("struct");
            out.push_str(&format!("#define _STRUCT_{name} {keyword} {{ \\\n"));
            depth = 1;
            continue;
        }
        let opens = line.matches('{').count();
        let closes = line.matches('}').count();
        if depth + opens == closes && line.starts_with('}') {
            out.push_str(line.trim_end_matches(';'));
            out.push_str("\n\n");
            depth = 0;
            continue;
        }
        depth = (depth + opens).saturating_sub(closes);
        out.push_str(line);
        out.push_str(" \\\n");
    }
    out
}

fn top_level_struct_name(line: &str) -> Option<&str> {
    let rest = line
        .strip_prefix("struct ")
        .or_else(|| line.strip_prefix("union "))?;
    let name = rest.split_whitespace().next()?;
    rest.trim_start()[name.len()..]
        .trim_start()
        .starts_with('{')
        .then_some(name)
}

/// Removes `/* ... */` (keeping the line breaks they span) and `//`
/// comments, so the struct scanner sees only code.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        let tail = &rest[start + 2..];
        let len = tail.find("*/").unwrap_or(tail.len());
        out.extend(tail[..len].chars().filter(|&c| c == '\n'));
        rest = tail.get(len + 2..).unwrap_or("");
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What driver.h needs from cmake's config.h: compiler capabilities and the
/// PABI. Debian builds rdma-core for both ioctl and write commands.
const CONFIG_H: &str = "\
#ifndef URDMA_RDMA_CORE_CONFIG_H
#define URDMA_RDMA_CORE_CONFIG_H
#define HAVE_STATEMENT_EXPR 1
#define HAVE_BUILTIN_TYPES_COMPATIBLE_P 1
#define HAVE_TYPEOF 1
#define HAVE_ISBLANK 1
#define HAVE_BUILTIN_CLZ 1
#define HAVE_BUILTIN_CLZL 1
#define HAVE_FUNC_ATTRIBUTE_ALWAYS_INLINE 1
#define HAVE_FUNC_ATTRIBUTE_SYMVER 1
#define HAVE_FULL_SYMBOL_VERSIONS 1
#define SIZEOF_LONG 8
#define IBVERBS_PABI_VERSION 34
#define VERBS_IOCTL_ONLY 0
#define VERBS_WRITE_ONLY 0
#define RDMA_CDEV_DIR \"/dev/infiniband\"
#define STREAM_CLOEXEC \"e\"
#endif
";
