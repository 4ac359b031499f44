//! The `digits` component: raw 8×8 grayscale images in, digit label and top-3 out.
//!
//! Input `image`: UINT8 with 64 bytes per image (shape `[64]`, `[8, 8]`, `[N, 64]` or
//! `[N, 8, 8]`), or BYTES with one 64-byte string per image. Pixels are 0 (background) to
//! 255 (ink); the component scales them to [0, 1] as the model was trained, calls the
//! tenant's `digits-mlp` model once for the whole batch, and returns `label` INT64 `[N]`,
//! `top3_labels` INT64 `[N, 3]` and `top3_probabilities` FP32 `[N, 3]`.

use sluice_guest::{Datatype, Error, Handler, Model, ModelTensor, Request, Response, Tensor};

const PIXELS: usize = 64;
const CLASSES: usize = 10;
const TOP: usize = 3;

struct Digits;

impl Handler for Digits {
    fn infer(request: Request) -> Result<Response, Error> {
        let images = read_images(request.input("image")?)?;
        let count = images.len() / PIXELS;
        let scaled: Vec<f32> = images.iter().map(|&p| f32::from(p) / 255.0).collect();

        let model = Model::load("digits-mlp")?;
        let outputs =
            model.compute(vec![("X".to_string(), ModelTensor::from_f32(&[count as u32, PIXELS as u32], &scaled))])?;
        let labels = outputs.get("label")?.to_i64()?;
        let probabilities = outputs.get("probabilities")?.to_f32()?;
        if labels.len() != count || probabilities.len() != count * CLASSES {
            return Err(Error::model("digits model returned an unexpected output size"));
        }

        let mut top_labels = Vec::with_capacity(count * TOP);
        let mut top_probabilities = Vec::with_capacity(count * TOP);
        for row in probabilities.chunks_exact(CLASSES) {
            let mut order: Vec<usize> = (0..CLASSES).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            for &class in &order[..TOP] {
                top_labels.push(class as i64);
                top_probabilities.push(row[class]);
            }
        }
        let n = count as u64;
        Ok(Response::new()
            .with_output(Tensor::from_i64("label", &[n], &labels))
            .with_output(Tensor::from_i64("top3_labels", &[n, TOP as u64], &top_labels))
            .with_output(Tensor::from_f32("top3_probabilities", &[n, TOP as u64], &top_probabilities)))
    }
}

/// All images' pixels, 64 per image, from a UINT8 or BYTES tensor.
fn read_images(tensor: &Tensor) -> Result<Vec<u8>, Error> {
    let pixels = match tensor.datatype {
        Datatype::Bytes => {
            let elements = tensor.to_bytes()?;
            if let Some(bad) = elements.iter().position(|e| e.len() != PIXELS) {
                return Err(Error::invalid_input(format!(
                    "image {bad} has {} bytes; each image must be {PIXELS} bytes (8x8 grayscale)",
                    elements[bad].len()
                )));
            }
            elements.concat()
        }
        _ => tensor.to_u8()?,
    };
    if pixels.is_empty() || !pixels.len().is_multiple_of(PIXELS) {
        return Err(Error::invalid_input(format!(
            "'image' has {} bytes; expected a multiple of {PIXELS} (8x8 grayscale per image)",
            pixels.len()
        )));
    }
    Ok(pixels)
}

sluice_guest::export!(Digits);
