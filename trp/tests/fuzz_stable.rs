//! The fuzz targets on the stable toolchain: the committed corpus plus
//! seeded random and mutated inputs through the same entry points cargo-fuzz
//! uses. `TRP_FUZZ_ITERS=<n>` raises the number of generated inputs.

use std::path::PathBuf;
use trp::sim::Rng;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let v: Vec<_> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!v.is_empty(), "empty corpus for {target}");
    v
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len() as u64) as usize].clone();
    for _ in 0..1 + rng.below(8) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5) as usize];
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v.truncate(i);
            }
            3 => {
                let i = rng.below(v.len() as u64 + 1) as usize;
                v.insert(i, rng.next_u64() as u8);
            }
            4 => {
                let other = &seeds[rng.below(seeds.len() as u64) as usize];
                let at = rng.below(other.len() as u64 + 1) as usize;
                v.extend_from_slice(&other[at..]);
            }
            _ => {
                let n = rng.below(64) as usize;
                let mut r = vec![0u8; n];
                rng.fill(&mut r);
                v.extend_from_slice(&r);
            }
        }
    }
    v
}

fn run(target: &str, f: fn(&[u8]), default_iters: u64) {
    let seeds = corpus(target);
    for s in &seeds {
        f(s);
    }
    let iters = std::env::var("TRP_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_iters);
    let mut rng = Rng::new(0xf0_22);
    for i in 0..iters {
        let input = if i % 4 == 0 {
            let mut r = vec![0u8; rng.below(256) as usize];
            rng.fill(&mut r);
            r
        } else {
            mutate(&mut rng, &seeds)
        };
        let r = std::panic::catch_unwind(|| f(&input));
        assert!(r.is_ok(), "{target} panicked on input {input:02x?}");
    }
}

#[test]
fn parsers() {
    run("parsers", trp::fuzzing::parsers, 20_000);
}

#[test]
fn receive_path() {
    run("receive_path", trp::fuzzing::receive_path, 1_500);
}

#[test]
fn receive_bursts() {
    run("receive_bursts", trp::fuzzing::receive_bursts, 1_500);
}
