//! The `magika` component: content-type detection with Google's Magika model.
//!
//! Input `file`: BYTES, one element per file (raw file contents), or UINT8 holding one
//! file's bytes (for clients that cannot send binary BYTES elements). For each file the
//! component does Magika's feature extraction in Wasm (the first and last bytes of the
//! file's leading and trailing blocks, whitespace-stripped and padded, as the model's
//! configuration says), calls the tenant's `magika-v3` model once for all files, and applies
//! the per-label thresholds. Outputs `label` BYTES `[N]` and `score` FP32 `[N]`.
//!
//! The label table is generated from the model's own configuration by
//! `scripts/fetch_magika.py` and embedded at build time.

mod features;
mod labels;

use features::Features;
use labels::LabelTable;
use sluice_guest::{Datatype, Error, Handler, Model, ModelTensor, Request, Response, Tensor};

const LABEL_TABLE: &str = include_str!("../model/labels.tsv");

struct Magika;

impl Handler for Magika {
    fn infer(request: Request) -> Result<Response, Error> {
        let table = LabelTable::parse(LABEL_TABLE).map_err(Error::internal)?;
        let input = request.input("file")?;
        let files: Vec<Vec<u8>> = match input.datatype {
            Datatype::Uint8 => vec![input.to_u8()?],
            _ => input.to_bytes()?.to_vec(),
        };

        let mut answers: Vec<Option<(String, f32)>> = Vec::with_capacity(files.len());
        let mut model_rows: Vec<i32> = Vec::new();
        for file in &files {
            match features::extract(file, &table.features) {
                Features::Empty => answers.push(Some(("empty".to_string(), 1.0))),
                Features::TooFew(content) => {
                    let label = if std::str::from_utf8(content).is_ok() { "txt" } else { "unknown" };
                    answers.push(Some((label.to_string(), 1.0)));
                }
                Features::Model(row) => {
                    model_rows.extend(row);
                    answers.push(None);
                }
            }
        }

        let mut predictions = predict(&table, &model_rows)?.into_iter();
        let mut labels = Vec::with_capacity(answers.len());
        let mut scores = Vec::with_capacity(answers.len());
        for answer in answers {
            let (label, score) = match answer {
                Some(known) => known,
                None => predictions.next().ok_or_else(|| Error::model("magika returned too few rows"))?,
            };
            labels.push(label.into_bytes());
            scores.push(score);
        }
        let n = labels.len() as u64;
        Ok(Response::new().with_output(Tensor::from_bytes("label", &[n], labels)).with_output(Tensor::from_f32(
            "score",
            &[n],
            &scores,
        )))
    }
}

/// Run the model on the feature rows; one (label, score) per row.
fn predict(table: &LabelTable, rows: &[i32]) -> Result<Vec<(String, f32)>, Error> {
    let width = table.features.row_len();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let count = rows.len() / width;
    let model = Model::load("magika-v3")?;
    let outputs =
        model.compute(vec![("bytes".to_string(), ModelTensor::from_i32(&[count as u32, width as u32], rows))])?;
    let probabilities = outputs.get("target_label")?.to_f32()?;
    let classes = table.labels.len();
    if probabilities.len() != count * classes {
        return Err(Error::model(format!(
            "magika returned {} scores for {count} files of {classes} labels",
            probabilities.len()
        )));
    }
    Ok(probabilities.chunks_exact(classes).map(|row| table.decide(row)).collect())
}

sluice_guest::export!(Magika);
