//! A TCP proxy that passes every chunk on `delay` after it arrived, each way, in order:
//! NATS as if it were across a network, for the `leader` scenario
//! (`scripts/bench.sh` with `BENCH_LEADER_DELAY_US`). Threads and blocking sockets, not
//! tokio: its timer rounds sleeps up to whole milliseconds.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::flags::fail;

/// Accepts connections on `listen` and joins each to a new one to `upstream`, until killed.
pub fn run(listen: &str, upstream: &str, delay: Duration) -> ! {
    let listener = TcpListener::bind(listen)
        .unwrap_or_else(|e| fail(&format!("delay proxy: cannot listen on {listen}: {e}")));
    eprintln!(
        "bench: delay proxy {listen} → {upstream}, {} µs each way",
        delay.as_micros()
    );
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let server = match TcpStream::connect(upstream) {
            Ok(server) => server,
            Err(e) => {
                eprintln!("bench: delay proxy: cannot reach {upstream}: {e}");
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        match (client.try_clone(), server.try_clone()) {
            (Ok(client_side), Ok(server_side)) => {
                pipe(client_side, server, delay);
                pipe(server_side, client, delay);
            }
            _ => eprintln!("bench: delay proxy: cannot share a connection between threads"),
        }
    }
    fail("delay proxy: the listener stopped");
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if chunks
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    thread::spawn(move || {
        for (at, chunk) in due {
            let now = Instant::now();
            if at > now {
                thread::sleep(at - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}
