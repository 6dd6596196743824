#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| trp::fuzzing::receive_bursts(data));
