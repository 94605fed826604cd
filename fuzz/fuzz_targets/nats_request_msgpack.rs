//! Fuzzes every NATS request body in msgpack (`Content-Type: application/msgpack`):
//! decoded as each subject's request and checked as the gateway does; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("common/nats_requests.rs");

fuzz_target!(|data: &[u8]| exercise(Codec::Msgpack, data));
