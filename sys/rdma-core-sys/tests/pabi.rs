//! The build's check of the installed libibverbs' provider ABI (pabi.rs), against the
//! library on this machine and against fake ones made here.

#[path = "../pabi.rs"]
mod pabi;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A shared library whose symbols carry the version `IBVERBS_PRIVATE_<pabi>`, as a
/// libibverbs of that PABI exports its provider functions.
fn fake_libibverbs(dir: &Path, pabi: u32) -> PathBuf {
    let c = dir.join("fake.c");
    let map = dir.join("fake.map");
    let lib = dir.join(format!("libibverbs-{pabi}.so.1"));
    std::fs::write(
        &c,
        format!("int verbs_register_driver_{pabi}(void) {{ return 0; }}\n"),
    )
    .unwrap();
    std::fs::write(
        &map,
        format!("IBVERBS_PRIVATE_{pabi} {{ global: verbs_register_driver_{pabi}; local: *; }};\n"),
    )
    .unwrap();
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&c)
        .arg(format!("-Wl,--version-script={}", map.display()))
        .status()
        .expect("cc")
        .success();
    assert!(ok, "cc could not build the fake library");
    lib
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("urdma-pabi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_installed_libibverbs_speaks_pabi_34() {
    let lib = pabi::installed().expect("libibverbs.so.1 is installed (scripts/setup)");
    assert_eq!(pabi::check(&lib, 34), Ok(()));
}

#[test]
fn a_libibverbs_of_another_pabi_is_refused_in_one_line() {
    let dir = scratch("other");
    let lib = fake_libibverbs(&dir, 57);
    assert_eq!(pabi::defined(&std::fs::read(&lib).unwrap()), vec![57]);
    let e = pabi::check(&lib, 34).unwrap_err();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.contains("has provider ABI 57"), "{e}");
    assert!(e.contains("for PABI 34"), "{e}");
    assert!(e.contains("liburdma-rdmav34.so"), "{e}");
    // The same library, of the right PABI, passes.
    assert_eq!(pabi::check(&fake_libibverbs(&dir, 34), 34), Ok(()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_that_is_no_libibverbs_is_refused() {
    let dir = scratch("none");
    let not_lib = dir.join("libibverbs.so.1");
    std::fs::write(
        &not_lib,
        b"IBVERBS_PRIVATE_ IBVERBS_PRIVATE_3x IBVERBS_PRIVATE_99999999999\0",
    )
    .unwrap();
    let e = pabi::check(&not_lib, 34).unwrap_err();
    assert!(e.contains("no provider ABI"), "{e}");
    assert!(pabi::check(&dir.join("missing"), 34)
        .unwrap_err()
        .contains("cannot read"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn version_names_are_read_whole_and_each_once() {
    let bytes = b"\0IBVERBS_PRIVATE_34\0IBVERBS_1.1\0IBVERBS_PRIVATE_34\0IBVERBS_PRIVATE_57\0IBVERBS_PRIVATE_5";
    assert_eq!(pabi::defined(bytes), vec![34, 57]);
    assert_eq!(pabi::defined(b""), Vec::<u32>::new());
}
