//! Triton's streaming extension (`ModelStreamInfer`): a client's inference requests and their
//! answers on one bidirectional gRPC stream, as `tritonclient`'s `start_stream` and
//! perf_analyzer's `--streaming` use it. Each request is answered on a task of its own (by
//! `grpc`, on the path of a call: the same admission, limits, pipeline and error messages).
//! Answers go back as they are ready, each with its request's id; a request that fails is
//! answered with its error message, and the stream goes on.
//!
//! What a stream may make the server hold is bounded as a call's is:
//! - the body layer counts the stream against its tenant's streams (at most its
//!   `max_concurrent_requests` open at once), and that place is held until the stream's last
//!   answer is written out (see `held`);
//! - at most that many of one stream's requests run at once; the next request is read only
//!   when one of them has been answered;
//! - the stream runs only as tonic asks it for the next answer, which tonic does only as the
//!   client reads: a client that reads nothing stops its stream from reading more requests;
//! - an answer keeps its request's place in the tenant's quota until tonic has taken it and
//!   asks for the next one.
//!
//! When the listeners close (a drain), a stream reads no more requests, answers those it has,
//! and ends with UNAVAILABLE, so the client opens its next stream on another replica.

use std::pin::Pin;

use futures::Stream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::{Status, Streaming};

use crate::infer::InFlight;

/// The answers of a stream, as tonic sends them.
pub type Answers<A> = Pin<Box<dyn Stream<Item = Result<A, Status>> + Send>>;

/// The answers to the requests that come on `requests`: each answered by `answer` (with the
/// place in the tenant's quota it holds), at most `most_running()` at once, until the client's
/// last request, or until `closing` turns true.
pub fn answers<Q, A, F, Fut>(
    requests: Streaming<Q>,
    most_running: impl Fn() -> usize + Send + 'static,
    closing: watch::Receiver<bool>,
    answer: F,
) -> Answers<A>
where
    Q: Send + 'static,
    A: Send + 'static,
    F: Fn(Q) -> Fut + Send + 'static,
    Fut: Future<Output = (A, Option<InFlight>)> + Send + 'static,
{
    let open = Open {
        requests,
        running: JoinSet::new(),
        most_running: Box::new(most_running),
        answer,
        reading: true,
        sent_last: None,
        ending: None,
        closing,
    };
    Box::pin(futures::stream::unfold(open, next_answer))
}

/// A stream's state between answers.
struct Open<Q, A, F> {
    requests: Streaming<Q>,
    /// The requests being answered, each with its place in the tenant's quota.
    running: JoinSet<(A, Option<InFlight>)>,
    most_running: Box<dyn Fn() -> usize + Send>,
    answer: F,
    /// Whether more requests are read: not after the client's last, a broken message or the
    /// listeners' close.
    reading: bool,
    /// The place of the answer tonic took last, held until it asks for the next: it asks
    /// only once it could hand that answer on, which waits for the client to read.
    sent_last: Option<InFlight>,
    /// The status the stream ends with once its requests are answered (OK where `None`).
    ending: Option<Status>,
    closing: watch::Receiver<bool>,
}

/// The stream's next answer, reading requests and starting them meanwhile; `None` at its end.
async fn next_answer<Q, A, F, Fut>(mut open: Open<Q, A, F>) -> Option<(Result<A, Status>, Open<Q, A, F>)>
where
    Q: Send + 'static,
    A: Send + 'static,
    F: Fn(Q) -> Fut + Send + 'static,
    Fut: Future<Output = (A, Option<InFlight>)> + Send + 'static,
{
    open.sent_last = None;
    loop {
        if !open.reading && open.running.is_empty() {
            let ending = open.ending.take()?;
            return Some((Err(ending), open));
        }
        let room = open.running.len() < (open.most_running)();
        tokio::select! {
            Some(answered) = open.running.join_next(), if !open.running.is_empty() => {
                let (answer, in_flight) = match answered {
                    Ok(answered) => answered,
                    Err(failed) => {
                        // A panic: the stream ends (its other requests are cancelled).
                        tracing::error!(error = %failed, "a stream's request failed");
                        open.reading = false;
                        open.running.abort_all();
                        return Some((Err(Status::internal("a request on the stream failed")), open));
                    }
                };
                open.sent_last = in_flight;
                return Some((Ok(answer), open));
            }
            request = open.requests.message(), if open.reading && room => match request {
                Ok(Some(request)) => {
                    open.running.spawn((open.answer)(request));
                }
                Ok(None) => open.reading = false,
                Err(status) => {
                    open.reading = false;
                    open.ending = Some(status);
                }
            },
            () = closed(&mut open.closing), if open.reading => {
                open.reading = false;
                open.ending = Some(Status::unavailable(
                    "the server is shutting down: send further requests on a new stream",
                ));
            }
        }
    }
}

/// Until the listeners close.
async fn closed(closing: &mut watch::Receiver<bool>) {
    if closing.wait_for(|closing| *closing).await.is_err() {
        // The server is gone: it never closes, and the stream ends with the connection.
        std::future::pending::<()>().await;
    }
}
