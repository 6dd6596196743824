//! The built provider must load into Debian's libibverbs 44 and stay out of
//! the application's symbol namespace: it defines no dynamic symbols (it
//! registers from a constructor), and every versioned libibverbs symbol it
//! needs is one that the installed library defines.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

const LIBIBVERBS: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// `liburdma.so` of the same build as this test (target/<profile>/).
fn provider() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let so = dir.join("liburdma.so");
    assert!(so.is_file(), "{} not built", so.display());
    so
}

fn dynamic_symbols(lib: &std::path::Path, defined: bool) -> Vec<String> {
    let mut cmd = Command::new("nm");
    cmd.arg("-D");
    cmd.arg(if defined {
        "--defined-only"
    } else {
        "--undefined-only"
    });
    let out = cmd.arg(lib).output().expect("run nm (binutils)");
    assert!(out.status.success(), "nm {}", lib.display());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect()
}

#[test]
fn provider_exports_nothing() {
    let exported: Vec<_> = dynamic_symbols(&provider(), true)
        .into_iter()
        // Linker-generated markers, not code or data.
        .filter(|s| {
            !matches!(
                s.as_str(),
                "_init" | "_fini" | "_edata" | "_end" | "__bss_start"
            )
        })
        .collect();
    assert!(exported.is_empty(), "liburdma.so exports {exported:?}");
}

#[test]
fn every_libibverbs_import_exists_in_the_installed_library() {
    let available: BTreeSet<String> = dynamic_symbols(LIBIBVERBS.as_ref(), true)
        .into_iter()
        .map(|s| s.replace("@@", "@"))
        .collect();
    let needed: Vec<String> = dynamic_symbols(&provider(), false)
        .into_iter()
        .filter(|s| s.contains("@IBVERBS_"))
        .collect();
    assert!(
        needed
            .iter()
            .any(|s| s == "verbs_register_driver_34@IBVERBS_PRIVATE_34"),
        "provider does not register with PABI 34: {needed:?}"
    );
    let missing: Vec<_> = needed.iter().filter(|s| !available.contains(*s)).collect();
    assert!(missing.is_empty(), "not in {LIBIBVERBS}: {missing:?}");
}
