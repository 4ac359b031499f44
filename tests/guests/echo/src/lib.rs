//! A trivial tenant component: it answers the request's inputs unchanged, calls no model and
//! logs nothing. The layers benchmark instantiates it fresh per call to measure the sandbox
//! alone.

use sluice_guest::{Error, Handler, Request, Response};

struct Echo;

impl Handler for Echo {
    fn infer(request: Request) -> Result<Response, Error> {
        Ok(request.inputs.into_iter().fold(Response::new(), Response::with_output))
    }
}

sluice_guest::export!(Echo);
