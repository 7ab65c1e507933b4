//! What a data call on an engine descriptor costs in system calls (run by hand under
//! `strace -c -f`, see `preload/README.md`): `XWARP_COST_N` writes of 64 bytes and as
//! many reads (nonblocking: an `EAGAIN` read counts as a call), the peer draining and
//! echoing in between.
use std::sync::Arc;
use std::time::Duration;

use crate::sock::tests::{client_write, connected, wait_for};
use crate::sock::{self, Sock};

#[test]
#[ignore = "a measurement: run under strace -c -f with XWARP_COST_N set"]
fn cost_of_data_calls_on_an_engine_descriptor() {
    let n: usize = std::env::var("XWARP_COST_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let (_a, _b, st, mut client) = connected();
    wait_for("established", Duration::from_secs(5), || {
        client.poll_connect().unwrap_or(false)
    });
    // SAFETY: a new descriptor for the connection, as the shim places it.
    let fd = unsafe { libc::dup(st.common.evfd) };
    sock::insert(fd, Arc::new(Sock::Stream(st)));
    let out = [5u8; 64];
    let mut got = [0u8; 64];
    let mut sink = [0u8; 4096];
    let mut calls = 0u64;
    for _ in 0..n {
        // SAFETY: local buffers, our descriptor (blocking: waits for the echo).
        unsafe {
            assert_eq!(crate::io::write(fd, out.as_ptr().cast(), 64), 64);
        }
        calls += 1;
        let mut seen = 0;
        while seen < 64 {
            match client.try_read(&mut sink[..64 - seen]) {
                Ok(k) => seen += k,
                Err(_) => {
                    let _ = client.wait(Some(std::time::Instant::now() + Duration::from_millis(5)));
                }
            }
        }
        client_write(&mut client, &out);
        let mut have = 0;
        while have < 64 {
            // SAFETY: as above.
            let r = unsafe { crate::io::read(fd, got[have..].as_mut_ptr().cast(), 64 - have) };
            calls += 1;
            if r < 0 {
                assert_eq!(crate::errno::last_errno(), libc::EAGAIN, "read failed");
                std::thread::yield_now();
                continue;
            }
            have += r as usize;
        }
    }
    eprintln!("data calls: {calls}");
    sock::remove(fd);
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}
