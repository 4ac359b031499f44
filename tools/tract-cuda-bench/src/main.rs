//! Rows/s of tract's CUDA runtime on ONNX models at batch 1, 8, 32 and 128 rows (batches back
//! to back, one model compiled per batch size), and each batch's largest difference from
//! tract on the CPU against the largest CPU output. Prints a Markdown table.
//!
//! Usage: tract-cuda-bench SECONDS MODEL.onnx...   (TRACT_RUNTIME=cpu: a rehearsal without a GPU)

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tract_onnx::prelude::*;
use tract_onnx::tract_core::runtime::{Runnable, runtime_for_name};
use tract_onnx::tract_hir::infer::{Factoid, ShapeFactoid};

const BATCHES: [usize; 4] = [1, 8, 32, 128];

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().context("usage: tract-cuda-bench SECONDS MODEL.onnx...")?.parse()?;
    // Linking the crate registers its runtime; naming it keeps the linker from dropping it.
    let _ = tract_cuda::CudaTransform;
    let name = std::env::var("TRACT_RUNTIME").unwrap_or_else(|_| "cuda".to_string());
    let cuda = runtime_for_name(&name)?.with_context(|| format!("tract has no {name} runtime"))?;
    let cpu = runtime_for_name("cpu")?.context("tract has no cpu runtime")?;
    println!("| model | batch | tract-cuda rows/s | largest difference from tract's CPU / largest output |");
    println!("| --- | --- | --- | --- |");
    for path in args {
        for batch in BATCHES {
            let row = (|| -> Result<String> {
                let model = typed(&path, batch)?;
                let inputs = inputs_for(&model, batch)?;
                let on_gpu = cuda.prepare(model.clone()).context("tract-cuda cannot prepare the model")?;
                let on_cpu = cpu.prepare(model)?;
                let difference = largest_difference(&*on_cpu, &*on_gpu, &inputs)?;
                let runs = runs_per_second(&*on_gpu, &inputs, Duration::from_secs_f64(seconds))?;
                Ok(format!("{:.0} | {difference:.2e}", runs * batch as f64))
            })();
            let name = std::path::Path::new(&path).file_stem().and_then(|s| s.to_str()).unwrap_or("?").to_string();
            match row {
                Ok(cells) => println!("| {name} | {batch} | {cells} |"),
                Err(err) => println!("| {name} | {batch} | failed: {} | |", format!("{err:#}").replace('\n', " ")),
            }
        }
    }
    Ok(())
}

/// The model typed with `batch` rows in the first dimension and 1 in any other unknown one.
fn typed(path: &str, batch: usize) -> Result<TypedModel> {
    let mut model = tract_onnx::onnx().with_ignore_output_shapes(true).model_for_path(path)?;
    for ix in 0..model.inputs.len() {
        let fact = model.input_fact(ix)?.clone();
        let dims: ShapeFactoid = fact
            .shape
            .dims()
            .enumerate()
            .map(|(axis, dim)| match dim.concretize() {
                Some(known) if known.to_i64().is_ok() => known,
                _ if axis == 0 => TDim::from(batch),
                _ => TDim::from(1),
            })
            .collect();
        model.set_input_fact(ix, InferenceFact { shape: dims, ..fact })?;
    }
    model.into_typed()
}

/// Deterministic inputs: floats in [0, 1), integers in 0..256 (magika's bytes).
fn inputs_for(model: &TypedModel, batch: usize) -> Result<TVec<TValue>> {
    model
        .input_outlets()?
        .iter()
        .map(|outlet| {
            let fact = model.outlet_fact(*outlet)?;
            let shape: Vec<usize> = fact.shape.as_concrete().context("input shape is not concrete")?.to_vec();
            let count: usize = shape.iter().product();
            let values = (0..count).map(|i| ((i * 7919 + batch * 31) % 256) as f64);
            let tensor = match fact.datum_type {
                DatumType::F32 => Tensor::from_shape(&shape, &values.map(|v| (v / 256.0) as f32).collect::<Vec<_>>())?,
                DatumType::I32 => Tensor::from_shape(&shape, &values.map(|v| v as i32).collect::<Vec<_>>())?,
                DatumType::I64 => Tensor::from_shape(&shape, &values.map(|v| v as i64).collect::<Vec<_>>())?,
                other => bail!("no inputs of type {other:?} here"),
            };
            Ok(tensor.into_tvalue())
        })
        .collect()
}

fn largest_difference(cpu: &dyn Runnable, gpu: &dyn Runnable, inputs: &TVec<TValue>) -> Result<f64> {
    let (expected, got) = (cpu.run(inputs.clone())?, gpu.run(inputs.clone())?);
    let mut largest: f64 = 0.0;
    for (a, b) in expected.iter().zip(got.iter()) {
        let (a, b) = (a.cast_to::<f64>()?, b.cast_to::<f64>()?);
        let (a, b) = (a.to_plain_array_view::<f64>()?, b.to_plain_array_view::<f64>()?);
        let scale = a.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(b.iter()).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        largest = largest.max(worst / scale);
    }
    Ok(largest)
}

fn runs_per_second(runnable: &dyn Runnable, inputs: &TVec<TValue>, window: Duration) -> Result<f64> {
    let mut state = runnable.spawn()?;
    for _ in 0..3 {
        state.run(inputs.clone())?;
    }
    let (started, mut runs) = (Instant::now(), 0u64);
    while started.elapsed() < window {
        state.run(inputs.clone())?;
        runs += 1;
    }
    Ok(runs as f64 / started.elapsed().as_secs_f64())
}
