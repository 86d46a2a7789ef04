//! The operator console: a live board of assets, holds and refunds for the
//! people running a sale. One page, its stylesheet and its script, written
//! for this project and embedded in the binary: no build step, no network,
//! no third-party code. The page reads and acts through the same JSON API as
//! any client.

use actix_web::http::header;
use actix_web::{get, HttpResponse};

use super::access::Caller;

const PAGE: &str = include_str!("../../console/index.html");
const STYLESHEET: &str = include_str!("../../console/console.css");
const SCRIPT: &str = include_str!("../../console/console.js");

/// The page loads only its own files and talks only to this origin; no
/// inline script or style runs, and no other site may frame it.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .body(body)
}

/// Declares one handler (and operation) per file of the console: its
/// route, its media type, its content, and what its answer is called.
macro_rules! console_files {
    ($(
        $(#[$doc:meta])*
        $handler:ident: $route:literal, $media:literal, $content:expr, $what:literal;
    )*) => {$(
        $(#[$doc])*
        #[utoipa::path(
            tag = "console",
            responses((status = 200, description = $what, content_type = $media, body = String,
                headers(
                    ("Content-Security-Policy" = String, description = "Only this origin; no \
                        inline code; never framed"),
                    ("Cache-Control" = String, description = "no-cache"),
                )))
        )]
        #[get($route)]
        pub async fn $handler(_caller: Caller) -> HttpResponse {
            file(concat!($media, "; charset=utf-8"), $content)
        }
    )*};
}

console_files! {
    /// The operator console, a live board of assets, holds and refunds.
    ///
    /// Counts per status, the asset board with live hold countdowns and buyers,
    /// refunds waiting, and each asset's timeline. With keys configured, a
    /// browser asks for an admin API key as the password of HTTP Basic (any user
    /// name).
    get_console: "/console", "text/html", PAGE, "The console page";
    /// The console's stylesheet.
    get_console_css: "/console/console.css", "text/css", STYLESHEET, "The stylesheet";
    /// The console's script.
    get_console_js: "/console/console.js", "text/javascript", SCRIPT, "The script";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(PAGE.contains("/console/console.css"));
        assert!(PAGE.contains("/console/console.js"));
        for text in [PAGE, STYLESHEET, SCRIPT] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        // No inline script or style: the policy would refuse it.
        assert!(!PAGE.contains("<style") && !PAGE.contains("style="));
        assert!(!PAGE.contains("<script>"));
        assert!(
            !has_inline_handler(PAGE),
            "an on…= attribute would be refused"
        );
    }

    fn has_inline_handler(html: &str) -> bool {
        html.match_indices(" on").any(|(at, _)| {
            let rest = &html[at + 3..];
            let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name_len > 0 && rest[name_len..].starts_with('=')
        })
    }
}
