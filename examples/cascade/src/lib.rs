//! The `cascade` component: routing logic in the guest.
//!
//! It asks the small, fast `digits-mlp-small` model first and calls the bigger `digits-mlp` model
//! only when the small model's confidence is below the request parameter `threshold`
//! (default 0.9). Input `image` as for the digits component (one image); outputs `label`
//! INT64 `[1]`, `score` FP32 `[1]` and `model` BYTES `[1]` naming the model that answered.

use sluice_guest::{Error, Handler, Model, ModelTensor, Request, Response, Tensor};

const PIXELS: usize = 64;
const DEFAULT_THRESHOLD: f32 = 0.9;

struct Cascade;

impl Handler for Cascade {
    fn infer(request: Request) -> Result<Response, Error> {
        let pixels = request.input("image")?.to_u8()?;
        if pixels.len() != PIXELS {
            return Err(Error::invalid_input(format!(
                "'image' has {} bytes; expected one 8x8 grayscale image ({PIXELS} bytes)",
                pixels.len()
            )));
        }
        let threshold = match request.parameter("threshold") {
            None => DEFAULT_THRESHOLD,
            Some(text) => text.parse::<f32>().ok().filter(|t| (0.0..=1.0).contains(t)).ok_or_else(|| {
                Error::invalid_input(format!("parameter 'threshold' must be a number in [0, 1], got '{text}'"))
            })?,
        };
        let input: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();

        let (mut label, mut score) = classify("digits-mlp-small", &input)?;
        let mut answered_by = "digits-mlp-small";
        if score < threshold {
            (label, score) = classify("digits-mlp", &input)?;
            answered_by = "digits-mlp";
        }
        Ok(Response::new()
            .with_output(Tensor::from_i64("label", &[1], &[label]))
            .with_output(Tensor::from_f32("score", &[1], &[score]))
            .with_output(Tensor::from_string("model", answered_by)))
    }
}

/// The label and its probability from one model.
fn classify(model_name: &str, input: &[f32]) -> Result<(i64, f32), Error> {
    let model = Model::load(model_name)?;
    let outputs = model.compute(vec![("X".to_string(), ModelTensor::from_f32(&[1, PIXELS as u32], input))])?;
    let label = *outputs.get("label")?.to_i64()?.first().ok_or_else(|| Error::model("empty label"))?;
    let probabilities = outputs.get("probabilities")?.to_f32()?;
    let score = usize::try_from(label)
        .ok()
        .and_then(|i| probabilities.get(i).copied())
        .ok_or_else(|| Error::model("label outside the probabilities"))?;
    Ok((label, score))
}

sluice_guest::export!(Cascade);
