//! A UDP relay on loopback, as a NAT looks to a peer: what a client sends
//! to the relay's address goes on to `target` from an upstream socket of
//! that client's own, and the replies go back; so the target sees the
//! client's connection come from an address other than the client's.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct UdpRelay {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Datagrams relayed, both ways.
    relayed: Arc<AtomicU64>,
}

impl UdpRelay {
    pub fn start(target: SocketAddr) -> UdpRelay {
        let listen = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        listen.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let addr = listen.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let relayed = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), relayed.clone());
        std::thread::spawn(move || {
            let mut upstream: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
            let mut buf = vec![0u8; 65_536];
            while !s.load(Ordering::Relaxed) {
                // A timeout, or an ICMP report of an earlier send.
                let Ok((len, client)) = listen.recv_from(&mut buf) else { continue };
                let up = upstream.entry(client).or_insert_with(|| {
                    let up = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
                    up.connect(target).unwrap();
                    up.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                    let (up2, listen, s, r) = (up.clone(), listen.clone(), s.clone(), r.clone());
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 65_536];
                        while !s.load(Ordering::Relaxed) {
                            let Ok(len) = up2.recv(&mut buf) else { continue };
                            let _ = listen.send_to(&buf[..len], client);
                            r.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    up
                });
                let _ = up.send(&buf[..len]);
                r.fetch_add(1, Ordering::Relaxed);
            }
        });
        UdpRelay { addr, stop, relayed }
    }

    pub fn relayed(&self) -> u64 {
        self.relayed.load(Ordering::Relaxed)
    }
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
