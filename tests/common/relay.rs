//! A TCP relay that a test can cut, as a network partition would: every connection it
//! carries is dropped and new ones are refused until it is mended. The nodes of a
//! [`super::NatsCluster`] reach each other's route ports only through relays.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

pub struct Relay {
    pub port: u16,
    cut: Arc<AtomicBool>,
    carried: Arc<Mutex<Vec<AbortHandle>>>,
    accepting: JoinHandle<()>,
}

impl Relay {
    /// Relays connections on a free loopback port to `target`.
    pub async fn start(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let carried: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accepting = tokio::spawn({
            let (cut, carried) = (cut.clone(), carried.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue; // dropped: refused
                    }
                    let carry = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    let mut carried = carried.lock().unwrap();
                    carried.retain(|c| !c.is_finished());
                    carried.push(carry.abort_handle());
                }
            }
        });
        Relay {
            port,
            cut,
            carried,
            accepting,
        }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for carried in self.carried.lock().unwrap().drain(..) {
            carried.abort();
        }
    }

    pub fn mend(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
        self.cut();
    }
}
