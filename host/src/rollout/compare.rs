//! Comparing a shadow version's answer with the primary's: do they agree on the label (the
//! arg-max of each row of a float output; equality for integer and byte outputs), and how
//! far apart are their float values.

use crate::oip::types::{Datatype, Payload, ValidTensor};

/// How a shadow answer compares with the primary answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// Every output of the primary has a shadow output of the same name and shape whose
    /// labels match.
    pub labels_agree: bool,
    /// Largest absolute difference between float values of same-shaped outputs.
    pub max_abs_diff: f64,
}

pub fn compare(primary: &[ValidTensor], shadow: &[ValidTensor]) -> Comparison {
    let mut labels_agree = true;
    let mut max_abs_diff: f64 = 0.0;
    // By name in a map: answers of many outputs compare in linear time (the first of a name
    // counts, so it is collected last).
    let shadow: std::collections::HashMap<&str, &ValidTensor> =
        shadow.iter().rev().map(|t| (t.name.as_str(), t)).collect();
    for expected in primary {
        let Some(&got) = shadow.get(expected.name.as_str()) else {
            labels_agree = false;
            continue;
        };
        if got.shape != expected.shape || got.datatype != expected.datatype {
            labels_agree = false;
            continue;
        }
        match (floats(expected), floats(got)) {
            (Some(a), Some(b)) => {
                for (x, y) in a.iter().zip(&b) {
                    max_abs_diff = max_abs_diff.max((x - y).abs());
                }
                let row = expected.shape.last().copied().unwrap_or(1).max(1) as usize;
                labels_agree &= a.chunks(row).zip(b.chunks(row)).all(|(x, y)| arg_max(x) == arg_max(y));
            }
            _ => labels_agree &= got.payload == expected.payload,
        }
    }
    Comparison { labels_agree, max_abs_diff }
}

/// A float tensor's values, or `None` for other datatypes.
fn floats(tensor: &ValidTensor) -> Option<Vec<f64>> {
    let (Datatype::Fixed(ty), Payload::Fixed(bytes)) = (&tensor.datatype, &tensor.payload) else { return None };
    ty.is_float().then(|| ty.values(bytes).collect())
}

fn arg_max(values: &[f64]) -> Option<usize> {
    values.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::ElementType;

    fn probabilities(values: &[f32]) -> ValidTensor {
        ValidTensor {
            name: "probabilities".into(),
            datatype: Datatype::Fixed(ElementType::F32),
            shape: vec![1, values.len() as u64],
            payload: Payload::Fixed(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        }
    }

    fn label(text: &str) -> ValidTensor {
        ValidTensor {
            name: "label".into(),
            datatype: Datatype::Bytes,
            shape: vec![1],
            payload: Payload::Bytes(vec![text.as_bytes().to_vec()]),
        }
    }

    #[test]
    fn same_labels_with_different_scores_agree_and_report_the_difference() {
        let primary = [probabilities(&[0.1, 0.7, 0.2]), label("seven")];
        let shadow = [probabilities(&[0.2, 0.5, 0.3]), label("seven")];
        let comparison = compare(&primary, &shadow);
        assert!(comparison.labels_agree);
        assert!((comparison.max_abs_diff - 0.2).abs() < 1e-6, "{comparison:?}");
    }

    #[test]
    fn a_different_arg_max_label_or_missing_output_disagrees() {
        let primary = [probabilities(&[0.1, 0.7, 0.2])];
        assert!(!compare(&primary, &[probabilities(&[0.8, 0.1, 0.1])]).labels_agree);
        assert!(!compare(&[label("seven")], &[label("one")]).labels_agree);
        assert!(!compare(&primary, &[label("seven")]).labels_agree, "no output of that name");
        assert!(!compare(&primary, &[probabilities(&[0.1, 0.9])]).labels_agree, "another shape");
    }
}
