//! The label table: each model output's label, confidence threshold, whether it is text,
//! and the label reported to the client.

use crate::features::FeatureConfig;

pub struct Label {
    pub threshold: f32,
    pub is_text: bool,
    pub output: String,
}

pub struct LabelTable {
    pub features: FeatureConfig,
    pub labels: Vec<Label>,
}

impl LabelTable {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut lines = text.lines();
        let header =
            lines.next().and_then(|l| l.strip_prefix("# features: ")).ok_or("label table has no features line")?;
        let value = |key: &str| -> Result<usize, String> {
            header
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("label table lacks {key}"))
        };
        let features = FeatureConfig {
            beg_size: value("beg_size")?,
            end_size: value("end_size")?,
            padding_token: value("padding_token")? as i32,
            block_size: value("block_size")?,
            min_file_size_for_dl: value("min_file_size_for_dl")?,
        };
        let mut labels = Vec::new();
        for line in lines.filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let fields: Vec<&str> = line.split('\t').collect();
            let [_name, threshold, is_text, output] = fields[..] else {
                return Err(format!("bad label table line: {line}"));
            };
            labels.push(Label {
                threshold: threshold.parse().map_err(|_| format!("bad threshold in: {line}"))?,
                is_text: is_text == "1",
                output: output.to_string(),
            });
        }
        Ok(Self { features, labels })
    }

    /// Magika's high-confidence decision for one row of probabilities.
    pub fn decide(&self, probabilities: &[f32]) -> (String, f32) {
        let (best, &score) = probabilities.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap_or((0, &0.0));
        let label = &self.labels[best];
        if score >= label.threshold {
            (label.output.clone(), score)
        } else if label.is_text {
            ("txt".to_string(), score)
        } else {
            ("unknown".to_string(), score)
        }
    }
}
