//! A TCP proxy between the service and PostgreSQL that a test can cut,
//! stall and restore: real network faults, not mocks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Close every connection and refuse new ones.
    Cut,
    /// Keep connections open but forward nothing (until the service closes
    /// its end).
    Stall,
}

pub struct Proxy {
    pub port: u16,
    mode: Arc<watch::Sender<Mode>>,
    accept: tokio::task::JoinHandle<()>,
    /// The service's connections open through the proxy.
    open: Arc<AtomicUsize>,
}

/// Counts a connection as open while it lives.
struct Open(Arc<AtomicUsize>);

impl Open {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(open))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Proxy {
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode, _) = watch::channel(Mode::Pass);
        let mode = Arc::new(mode);
        let upstream = upstream.to_owned();
        let modes = mode.clone();
        let open = Arc::new(AtomicUsize::new(0));
        let opened = Arc::clone(&open);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut changes = modes.subscribe();
                let current = *changes.borrow_and_update();
                if current == Mode::Cut {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let counted = Open::new(&opened);
                tokio::spawn(async move {
                    relay(client, upstream, current, changes).await;
                    drop(counted);
                });
            }
        });
        Self {
            port,
            mode,
            accept,
            open,
        }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// How many of the service's connections through the proxy are open.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
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
                // Hold both sockets silently until the mode changes (a
                // stalled connection is broken for good: close it then) or
                // the service closes its end.
                let mut unread = [0u8; 1024];
                loop {
                    tokio::select! {
                        _ = changes.changed() => return,
                        read = client.read(&mut unread) => {
                            if matches!(read, Ok(0) | Err(_)) {
                                return;
                            }
                        }
                    }
                }
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

/// A proxy that passes everything through and records the text of every
/// statement the service sends to PostgreSQL: each one it parses (extended
/// protocol) and each simple query, in the order sent.
pub struct Recorder {
    pub port: u16,
    statements: Arc<std::sync::Mutex<Vec<String>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let statements = Arc::new(std::sync::Mutex::new(Vec::new()));
        let upstream = upstream.to_owned();
        let log = statements.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, log) = (upstream.clone(), log.clone());
                tokio::spawn(async move { record(client, upstream, log).await });
            }
        });
        Self {
            port,
            statements,
            accept,
        }
    }

    /// The statements recorded since the last call.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.statements.lock().unwrap())
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn record(client: TcpStream, upstream: String, log: Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let mut pending: Vec<u8> = Vec::new();
    // Until the startup message, messages have no type byte (SSL and GSS
    // requests come before it).
    let mut started = false;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from_client.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Recorded before it is forwarded: by the time the service has its
        // answer, the statement is in the log.
        pending.extend_from_slice(&chunk[..n]);
        while let Some((statement, used)) = next_message(&pending, &mut started) {
            if let Some(text) = statement {
                log.lock().unwrap().push(text);
            }
            pending.drain(..used);
        }
        if to_server.write_all(&chunk[..n]).await.is_err() {
            break;
        }
    }
    back.abort();
}

/// The first whole message in `bytes`: the statement text it carries (a
/// Parse or a simple Query), and its length; `None` until it is whole.
fn next_message(bytes: &[u8], started: &mut bool) -> Option<(Option<String>, usize)> {
    let length = |at: usize| -> Option<usize> {
        let raw: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_be_bytes(raw) as usize)
    };
    if !*started {
        let len = length(0)?;
        let code = length(4)?;
        if bytes.len() < len {
            return None;
        }
        // 196608: protocol 3.0's startup message; the rest are requests
        // (SSL, GSS, cancel) that come before it.
        *started = code == 196_608;
        return Some((None, len));
    }
    let len = 1 + length(1)?;
    if bytes.len() < len {
        return None;
    }
    let body = &bytes[5..len];
    let text = |from: usize| -> Option<String> {
        let end = body[from..].iter().position(|b| *b == 0)?;
        Some(String::from_utf8_lossy(&body[from..from + end]).into_owned())
    };
    let statement = match bytes[0] {
        // Parse: the statement's name, then its text.
        b'P' => body
            .iter()
            .position(|b| *b == 0)
            .and_then(|name| text(name + 1)),
        b'Q' => text(0),
        _ => None,
    };
    Some((statement, len))
}
