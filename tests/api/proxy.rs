//! A TCP proxy between the service and PostgreSQL that a test can cut,
//! stall and restore: real network faults, not mocks.

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Close every connection and refuse new ones.
    Cut,
    /// Keep connections open but forward nothing.
    Stall,
}

pub struct Proxy {
    pub port: u16,
    mode: Arc<watch::Sender<Mode>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode, _) = watch::channel(Mode::Pass);
        let mode = Arc::new(mode);
        let upstream = upstream.to_owned();
        let modes = mode.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut changes = modes.subscribe();
                let current = *changes.borrow_and_update();
                if current == Mode::Cut {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                tokio::spawn(async move { relay(client, upstream, current, changes).await });
            }
        });
        Self { port, mode, accept }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.mode.send_replace(Mode::Cut);
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: String,
    mut mode: Mode,
    mut changes: watch::Receiver<Mode>,
) {
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    loop {
        match mode {
            Mode::Cut => return,
            Mode::Stall => {
                // Hold both sockets silently until the mode changes.
                if changes.changed().await.is_err() {
                    return;
                }
                // A stalled connection is broken for good: close it.
                return;
            }
            Mode::Pass => {
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        mode = *changes.borrow_and_update();
                    }
                }
            }
        }
    }
}
