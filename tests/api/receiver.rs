//! A real HTTP receiver for webhook tests: records what it gets, and can be
//! told to fail its first requests.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const SECRET: &str = "test-webhook-secret-0123456789";

#[derive(Debug, Clone)]
pub struct Received {
    pub event_id: String,
    pub signature: String,
    pub body: String,
    pub method: String,
    pub path: String,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }

    /// Verifies the signature as a receiver would (see the README).
    pub fn signature_is_valid(&self) -> bool {
        let mut t = None;
        let mut v1 = None;
        for part in self.signature.split(',') {
            match part.split_once('=') {
                Some(("t", value)) => t = Some(value.to_owned()),
                Some(("v1", value)) => v1 = Some(value.to_owned()),
                _ => {}
            }
        }
        let (Some(t), Some(v1)) = (t, v1) else {
            return false;
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(format!("{t}.{}", self.body).as_bytes());
        let expected: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        expected == v1
    }
}

#[derive(Default)]
struct Inbox {
    received: Mutex<Vec<Received>>,
    failures_left: AtomicUsize,
    /// Answer every request but those to /landing with 302 to /landing.
    redirect: bool,
}

pub struct Receiver {
    pub url: String,
    inbox: Arc<Inbox>,
    server: actix_web::dev::ServerHandle,
}

async fn receive(req: HttpRequest, body: String, inbox: web::Data<Inbox>) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    inbox.received.lock().unwrap().push(Received {
        event_id: header("Holdfast-Event-Id"),
        signature: header("Holdfast-Signature"),
        body,
        method: req.method().to_string(),
        path: req.path().to_owned(),
    });
    if inbox.redirect && req.path() != "/landing" {
        return HttpResponse::Found()
            .insert_header(("Location", "/landing"))
            .finish();
    }
    let fail = inbox
        .failures_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if fail {
        HttpResponse::InternalServerError().finish()
    } else {
        HttpResponse::NoContent().finish()
    }
}

impl Receiver {
    /// A receiver on a free port that fails its first `fail_first` requests.
    pub async fn start(fail_first: usize) -> Self {
        Self::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), fail_first)
    }

    /// A port nobody listens on yet (for a receiver that is down).
    pub fn vacant_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    pub async fn start_on_port(port: u16) -> Self {
        Self::start_on(TcpListener::bind(("127.0.0.1", port)).unwrap(), 0)
    }

    /// A receiver that answers every POST with `302 Location: /landing`
    /// (where a GET would get 204).
    pub async fn start_redirecting() -> Self {
        Self::start_with(TcpListener::bind("127.0.0.1:0").unwrap(), 0, true)
    }

    fn start_on(listener: TcpListener, fail_first: usize) -> Self {
        Self::start_with(listener, fail_first, false)
    }

    fn start_with(listener: TcpListener, fail_first: usize, redirect: bool) -> Self {
        let port = listener.local_addr().unwrap().port();
        let inbox = Arc::new(Inbox {
            received: Mutex::new(Vec::new()),
            failures_left: AtomicUsize::new(fail_first),
            redirect,
        });
        let data = web::Data::from(inbox.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(receive))
        })
        .workers(1)
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            url: format!("http://127.0.0.1:{port}/hooks/holdfast"),
            inbox,
            server: handle,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.inbox.received.lock().unwrap().clone()
    }

    pub fn fail_next(&self, n: usize) {
        self.inbox.failures_left.store(n, Ordering::SeqCst);
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
    }
}
