//! An answer's bytes hold their request's place in the tenant's quota until the connection
//! has written them. hyper takes a body's frames as soon as it can queue them, and a client
//! that reads nothing leaves them queued: were the place given back when the handler returns,
//! such clients could make the server hold answers without bound (a connection each, answer
//! after answer). Each data frame here owns a share of the place, dropped with the frame once
//! it is written, so a tenant's unread answers are at most its `max_concurrent_requests`.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::infer::InFlight;

/// `body`, whose data frames each keep `in_flight` until they are dropped.
pub fn held<B>(body: B, in_flight: InFlight) -> Held<B> {
    Held { inner: body, in_flight }
}

pub struct Held<B> {
    inner: B,
    in_flight: InFlight,
}

/// A frame's bytes with their share of the place.
struct HeldBytes {
    bytes: Bytes,
    _in_flight: InFlight,
}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl<B> HttpBody for Held<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        let hold = |bytes| Bytes::from_owner(HeldBytes { bytes, _in_flight: self.in_flight.clone() });
        Poll::Ready(polled.map(|frame| frame.map(|frame| frame.map_data(hold))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use tokio::sync::Semaphore;

    use super::*;

    #[tokio::test]
    async fn the_place_is_free_only_once_every_frame_is_dropped() {
        let places = Arc::new(Semaphore::new(1));
        let in_flight = InFlight::new(places.clone().try_acquire_owned().expect("a free place"));
        let body = http_body_util::Full::new(Bytes::from_static(b"an answer"));
        let mut body = held(body, in_flight);
        assert_eq!(body.size_hint().exact(), Some(9), "the length still says Content-Length");
        let frame = body.frame().await.expect("a frame").expect("no error");
        assert!(body.frame().await.is_none(), "one frame");
        drop(body);
        assert_eq!(places.available_permits(), 0, "the frame's bytes, still queued to be written, hold it");
        assert_eq!(frame.into_data().expect("data"), Bytes::from_static(b"an answer"));
        assert_eq!(places.available_permits(), 1, "written and dropped: free");
    }
}
