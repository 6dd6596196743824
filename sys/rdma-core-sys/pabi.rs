//! Which provider ABI (PABI) the installed libibverbs speaks, for the build to refuse a
//! libibverbs that would never load the provider.
//!
//! libibverbs loads a provider by the file name `lib<name>-rdmav<PABI>.so` and exports its
//! provider-private functions under the symbol version `IBVERBS_PRIVATE_<PABI>`. A
//! provider built for another PABI is not even looked for, so the mismatch must be caught
//! when the provider is built. The bindings come from rdma-core sources of one PABI; the
//! library says which PABI it has through its version names, which are plain strings of
//! its dynamic string table. Debian ships no header that says it.

use std::path::{Path, PathBuf};

const PREFIX: &[u8] = b"IBVERBS_PRIVATE_";

/// The PABI versions `lib` (a library's bytes) defines: the N of each `IBVERBS_PRIVATE_N`
/// in it, ascending, each once.
pub fn defined(lib: &[u8]) -> Vec<u32> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = lib[at..].windows(PREFIX.len()).position(|w| w == PREFIX) {
        let digits_at = at + i + PREFIX.len();
        let digits: Vec<u8> = lib[digits_at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .copied()
            .collect();
        // A version name ends where its string does.
        let ends = lib.get(digits_at + digits.len()) == Some(&0);
        if let (true, Ok(n)) = (ends, String::from_utf8_lossy(&digits).parse::<u32>()) {
            found.push(n);
        }
        at = digits_at;
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// Whether the libibverbs at `lib` speaks PABI `want`; the error is one line for the user.
pub fn check(lib: &Path, want: u32) -> Result<(), String> {
    let bytes = std::fs::read(lib)
        .map_err(|e| format!("cannot read libibverbs at {}: {e}", lib.display()))?;
    let has = defined(&bytes);
    if has.contains(&want) {
        return Ok(());
    }
    let says = match has.as_slice() {
        [] => "no provider ABI (no IBVERBS_PRIVATE_ version)".to_string(),
        v => format!(
            "provider ABI {}",
            v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    Err(format!(
        "the installed libibverbs ({}) has {says}, and urdma's provider is for PABI {want} \
         (rdma-core 34 and later releases until the ABI changes; Debian 12 and 13, Ubuntu \
         22.04 and 24.04): its libibverbs would never load liburdma-rdmav{want}.so",
        lib.display()
    ))
}

/// The libibverbs the provider will be loaded by: `$URDMA_LIBIBVERBS` if set, else
/// `libibverbs.so.1` in pkg-config's `libdir` for libibverbs or in the usual library
/// directories.
pub fn installed() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("URDMA_LIBIBVERBS") {
        return Some(PathBuf::from(p));
    }
    let from_pkg_config = std::process::Command::new("pkg-config")
        .args(["--variable=libdir", "libibverbs"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    from_pkg_config
        .into_iter()
        .chain(
            [
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
            ]
            .map(PathBuf::from),
        )
        .map(|d| d.join("libibverbs.so.1"))
        .find(|p| p.is_file())
}
