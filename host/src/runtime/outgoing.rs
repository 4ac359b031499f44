//! Outgoing HTTP from HTTP apps (`wasi:http/outgoing-handler`): denied unless the tenant's
//! quota grants the host (`outgoing_http_hosts`), and then bounded by the request's deadline.
//! A tenant component never reaches the network otherwise: its WASI sockets are off.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// What one request's outgoing HTTP may reach: nothing (every OIP component's store, made
/// without an allocation), or the tenant's granted hosts until the request's deadline.
pub struct OutgoingHttp(Option<Grant>);

struct Grant {
    /// `host` (any port) or `host:port` entries.
    hosts: Arc<[String]>,
    deadline: Instant,
}

impl OutgoingHttp {
    /// Nothing granted.
    pub fn denied() -> Self {
        Self(None)
    }

    /// The tenant's granted `hosts`, until `deadline`.
    pub fn granted(hosts: Arc<[String]>, deadline: Instant) -> Self {
        Self(Some(Grant { hosts, deadline }))
    }

    fn grants(&self, authority: &Authority, scheme: Option<&Scheme>) -> bool {
        let Some(grant) = &self.0 else { return false };
        let port = authority.port_u16().unwrap_or(if scheme == Some(&Scheme::HTTPS) { 443 } else { 80 });
        grant.hosts.iter().any(|entry| match entry.rsplit_once(':') {
            Some((host, granted)) => {
                host.eq_ignore_ascii_case(authority.host()) && granted.parse::<u16>().ok() == Some(port)
            }
            None => entry.eq_ignore_ascii_case(authority.host()),
        })
    }

    /// The guest's own timeouts, none longer than what is left of the request's deadline.
    fn bounded(&self, options: Option<RequestOptions>) -> RequestOptions {
        let left =
            self.0.as_ref().map_or(Duration::ZERO, |grant| grant.deadline.saturating_duration_since(Instant::now()));
        let within = |timeout: Option<Duration>| Some(timeout.map_or(left, |t| t.min(left)));
        let options = options.unwrap_or_default();
        RequestOptions {
            connect_timeout: within(options.connect_timeout),
            first_byte_timeout: within(options.first_byte_timeout),
            between_bytes_timeout: within(options.between_bytes_timeout),
        }
    }
}

type SendFuture = Box<
    dyn Future<Output = Result<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), Error>> + Send>), Error>>
        + Send,
>;

impl WasiHttpHooks for OutgoingHttp {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> SendFuture {
        let uri = request.uri();
        if !uri.authority().is_some_and(|authority| self.grants(authority, uri.scheme())) {
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        let options = self.bounded(options);
        Box::new(async move {
            let (response, io) = wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            let response = response.map(BodyExt::boxed_unsync);
            Ok((response, Box::new(io) as Box<dyn Future<Output = Result<(), Error>> + Send>))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_granted_hosts_and_ports_are_reached() {
        let hosts: Arc<[String]> = Arc::from(["api.example.com".to_string(), "127.0.0.1:8080".to_string()]);
        let outgoing = OutgoingHttp::granted(hosts, Instant::now());
        let grants =
            |authority: &str, scheme: &Scheme| outgoing.grants(&authority.parse().expect("an authority"), Some(scheme));
        assert!(grants("api.example.com", &Scheme::HTTPS));
        assert!(grants("API.example.com:8443", &Scheme::HTTPS), "a host entry grants every port");
        assert!(grants("127.0.0.1:8080", &Scheme::HTTP));
        assert!(!grants("127.0.0.1:8081", &Scheme::HTTP), "a host:port entry grants that port only");
        assert!(!grants("127.0.0.1", &Scheme::HTTP), "port 80 is not 8080");
        assert!(!grants("example.com", &Scheme::HTTPS));
        assert!(!grants("api.example.com.evil.test", &Scheme::HTTPS));
        let denied = OutgoingHttp::denied();
        assert!(!denied.grants(&"api.example.com".parse().expect("an authority"), None));
    }

    #[test]
    fn outgoing_timeouts_end_with_the_request() {
        let outgoing = OutgoingHttp::granted(Arc::from([]), Instant::now() + Duration::from_millis(500));
        let options = outgoing.bounded(Some(RequestOptions {
            connect_timeout: Some(Duration::from_secs(60)),
            first_byte_timeout: Some(Duration::from_millis(100)),
            between_bytes_timeout: None,
        }));
        assert!(options.connect_timeout.is_some_and(|t| t <= Duration::from_millis(500)));
        assert_eq!(options.first_byte_timeout, Some(Duration::from_millis(100)));
        assert!(options.between_bytes_timeout.is_some_and(|t| t <= Duration::from_millis(500)));
    }
}
