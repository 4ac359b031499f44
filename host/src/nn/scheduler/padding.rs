//! Padding rules: requests whose inputs differ only along one declared axis (token
//! sequences of different lengths, say) may share a batch. Each is padded with the rule's
//! fill value to the longest in the batch, and the outputs the rule names are cut back to
//! each request's own length. Only models that ignore the fill (through an attention mask,
//! for instance) should declare one: the rule is the tenant's statement that padding does
//! not change a request's answer.

use super::NamedTensors;
use crate::tensor::Tensor;

/// One model's padding rule, from its manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct PaddingRule {
    /// The padded dimension (1 or more: dimension 0 is the batch).
    pub axis: usize,
    /// The value padded positions hold.
    pub fill: f64,
    /// Inputs padded along `axis`.
    pub inputs: Vec<String>,
    /// Outputs cut back along `axis` to each request's length.
    pub outputs: Vec<String>,
}

impl PaddingRule {
    /// Whether input `name` (of this rank) is padded.
    pub fn pads(&self, name: &str, rank: usize) -> bool {
        self.axis >= 1 && rank > self.axis && self.inputs.iter().any(|input| input == name)
    }

    /// A request's length along the axis: the longest of its padded inputs.
    fn length(&self, inputs: &[(String, Tensor)]) -> usize {
        inputs
            .iter()
            .filter(|(name, tensor)| self.pads(name, tensor.dims().len()))
            .map(|(_, tensor)| tensor.dims()[self.axis])
            .max()
            .unwrap_or(0)
    }

    /// The class of lengths a request of `inputs` shares a batch within: its length rounded up
    /// to a power of two. Requests of one class differ in length less than twofold, so padding
    /// never doubles a request's inputs: one tenant's long sequence is not padded into the batch
    /// of another's short ones (its memory and compute many times theirs).
    pub fn length_class(&self, inputs: &[(String, Tensor)]) -> usize {
        self.length(inputs).checked_next_power_of_two().unwrap_or(usize::MAX)
    }

    /// Pad every request's padded inputs to the longest length in the batch; returns each
    /// request's own length and the padded length.
    pub fn pad(&self, jobs: &mut [NamedTensors]) -> Option<(Vec<usize>, usize)> {
        let lengths: Vec<usize> = jobs.iter().map(|job| self.length(job)).collect();
        let longest = lengths.iter().copied().max()?;
        for job in jobs.iter_mut() {
            for (name, tensor) in job.iter_mut() {
                if self.pads(name, tensor.dims().len()) && tensor.dims()[self.axis] != longest {
                    *tensor = tensor.resize_axis(self.axis, longest, self.fill)?;
                }
            }
        }
        Some((lengths, longest))
    }

    /// Cut one request's named outputs that carry the padded length back to its own.
    pub fn cut(&self, outputs: &mut NamedTensors, length: usize, padded: usize) -> Option<()> {
        for (name, tensor) in outputs.iter_mut() {
            if self.outputs.contains(name) && tensor.dims().get(self.axis) == Some(&padded) && length != padded {
                *tensor = tensor.resize_axis(self.axis, length, self.fill)?;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::ElementType;

    fn tokens(rows: usize, values: &[i64]) -> Tensor {
        let length = values.len() / rows;
        Tensor::new(ElementType::I64, vec![rows, length], values.iter().flat_map(|v| v.to_le_bytes()).collect())
            .expect("valid")
    }

    fn rule() -> PaddingRule {
        PaddingRule { axis: 1, fill: 0.0, inputs: vec!["ids".into(), "mask".into()], outputs: vec!["scores".into()] }
    }

    #[test]
    fn pads_each_request_to_the_longest_and_cuts_outputs_back() {
        let mut jobs = vec![
            vec![("ids".to_string(), tokens(1, &[5, 6])), ("mask".to_string(), tokens(1, &[1, 1]))],
            vec![("ids".to_string(), tokens(2, &[1, 2, 3, 4, 5, 6])), ("mask".to_string(), tokens(2, &[1; 6]))],
        ];
        let (lengths, longest) = rule().pad(&mut jobs).expect("paddable");
        assert_eq!((lengths, longest), (vec![2, 3], 3));
        assert_eq!(jobs[0][0].1, tokens(1, &[5, 6, 0]));
        assert_eq!(jobs[0][1].1, tokens(1, &[1, 1, 0]));
        assert_eq!(jobs[1][0].1, tokens(2, &[1, 2, 3, 4, 5, 6]), "the longest is untouched");

        let mut outputs =
            vec![("scores".to_string(), tokens(1, &[10, 20, 30])), ("total".to_string(), tokens(1, &[60]))];
        rule().cut(&mut outputs, 2, 3).expect("cut");
        assert_eq!(outputs[0].1, tokens(1, &[10, 20]), "named output cut back");
        assert_eq!(outputs[1].1, tokens(1, &[60]), "other outputs untouched");
    }
}
