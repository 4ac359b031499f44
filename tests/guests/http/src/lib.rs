//! A `wasi:http/proxy` component for the end-to-end tests, one behaviour per path:
//!
//! - `/echo`: the method, path and query it saw, whether an `authorization` header reached
//!   it, then the request body.
//! - `/status?code=N`: an empty answer with status N.
//! - `/big?bytes=N`: N bytes of body.
//! - `/spin`: loops for ever (the deadline must end it).
//! - `/grow`: allocates until its memory limit stops it.
//! - `/panic`: traps.
//! - `/unset`: returns without setting a response.
//! - `/headers`: builds a million header maps of 8 KiB in host memory and keeps them (the
//!   host must stop it); answers how many it made if it ever can.
//! - `/fetch?url=http://host:port/path`: an outgoing GET; answers `200` with the fetched
//!   status and body, or `502` with the error the host gave.

use wasip2::exports::http::incoming_handler::Guest;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingRequest, Method, OutgoingBody, OutgoingRequest, OutgoingResponse,
    ResponseOutparam, Scheme,
};
use wasip2::io::streams::{InputStream, StreamError};

struct HttpGuest;

impl Guest for HttpGuest {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let target = request.path_with_query().unwrap_or_default();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        match path {
            "/echo" => {
                let method = match request.method() {
                    Method::Get => "GET".to_string(),
                    Method::Post => "POST".to_string(),
                    Method::Put => "PUT".to_string(),
                    Method::Delete => "DELETE".to_string(),
                    other => format!("{other:?}"),
                };
                let authorization = if request.headers().has("authorization") { "present" } else { "absent" };
                let mut body = format!("{method} {target}\nauthorization: {authorization}\n").into_bytes();
                let Ok(incoming) = request.consume() else { return };
                body.extend(read_all(&incoming.stream().expect("the body's stream")));
                IncomingBody::finish(incoming);
                respond(out, 200, &body);
            }
            "/status" => respond(out, parameter(query, "code").unwrap_or(200) as u16, b""),
            "/big" => respond(out, 200, &vec![b'x'; parameter(query, "bytes").unwrap_or(0) as usize]),
            "/spin" => {
                let mut counter = 0u64;
                loop {
                    counter = std::hint::black_box(counter.wrapping_add(1));
                }
            }
            "/grow" => {
                let mut held = Vec::new();
                loop {
                    held.push(std::hint::black_box(vec![1u8; 1 << 20]));
                }
            }
            "/panic" => panic!("the http guest was asked to panic"),
            "/unset" => {}
            "/headers" => {
                // 8 KiB each: under any sensible limit of one map, so only their number is left
                // to cap.
                let value = vec![b'v'; 1024];
                let mut kept = Vec::new();
                for _ in 0..1_000_000 {
                    let fields = Fields::new();
                    for name in ["a", "b", "c", "d", "e", "f", "g", "h"] {
                        let _ = fields.append(name, &value);
                    }
                    kept.push(fields);
                }
                respond(out, 200, format!("{} header maps", kept.len()).as_bytes());
            }
            "/fetch" => {
                let url = query.strip_prefix("url=").unwrap_or_default();
                match fetch(url) {
                    Ok((status, body)) => {
                        let mut answer = format!("status {status}\n").into_bytes();
                        answer.extend(body);
                        respond(out, 200, &answer);
                    }
                    Err(error) => respond(out, 502, format!("error {error}").as_bytes()),
                }
            }
            _ => respond(out, 404, b"no such path"),
        }
    }
}

wasip2::http::proxy::export!(HttpGuest);

fn parameter(query: &str, name: &str) -> Option<u64> {
    query.split('&').find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
}

fn read_all(stream: &InputStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    while let Ok(chunk) = stream.blocking_read(64 * 1024) {
        bytes.extend(chunk);
    }
    bytes
}

/// GET `url` (`http://authority/path`).
fn fetch(url: &str) -> Result<(u16, Vec<u8>), String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (authority, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let request = OutgoingRequest::new(Fields::new());
    request.set_scheme(Some(&Scheme::Http)).map_err(|()| "scheme refused")?;
    request.set_authority(Some(authority)).map_err(|()| "authority refused")?;
    request.set_path_with_query(Some(&path)).map_err(|()| "path refused")?;
    let pending = outgoing_handler::handle(request, None).map_err(|code| format!("{code:?}"))?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(format!("{code:?}")),
        Some(Err(())) | None => return Err("no response".to_string()),
    };
    let status = response.status();
    let body = response.consume().map_err(|()| "no body")?;
    let bytes = read_all(&body.stream().map_err(|()| "no body stream")?);
    Ok((status, bytes))
}

fn respond(out: ResponseOutparam, status: u16, body: &[u8]) {
    let response = OutgoingResponse::new(Fields::new());
    if response.set_status_code(status).is_err() {
        ResponseOutparam::set(out, Err(ErrorCode::InternalError(Some(format!("status {status} refused")))));
        return;
    }
    let outgoing = response.body().expect("a new response's body");
    ResponseOutparam::set(out, Ok(response));
    let stream = outgoing.write().expect("the body's stream");
    for chunk in body.chunks(4096) {
        if let Err(StreamError::Closed | StreamError::LastOperationFailed(_)) = stream.blocking_write_and_flush(chunk) {
            return;
        }
    }
    drop(stream);
    let _ = OutgoingBody::finish(outgoing, None);
}
