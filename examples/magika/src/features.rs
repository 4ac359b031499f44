//! Magika's feature extraction: what the model sees of a file.

/// Sizes from the model's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureConfig {
    pub beg_size: usize,
    pub end_size: usize,
    pub padding_token: i32,
    pub block_size: usize,
    pub min_file_size_for_dl: usize,
}

impl FeatureConfig {
    pub fn row_len(&self) -> usize {
        self.beg_size + self.end_size
    }
}

/// What to do with one file.
pub enum Features<'a> {
    /// No bytes at all.
    Empty,
    /// Too few meaningful bytes for the model: decide from the content itself.
    TooFew(&'a [u8]),
    /// A feature row for the model.
    Model(Vec<i32>),
}

pub fn extract<'a>(file: &'a [u8], config: &FeatureConfig) -> Features<'a> {
    if file.is_empty() {
        return Features::Empty;
    }
    if file.len() < config.min_file_size_for_dl {
        return Features::TooFew(file);
    }
    let block = config.block_size.min(file.len());
    let beg = file[..block].trim_ascii_start();
    let end = file[file.len() - block..].trim_ascii_end();

    let mut row = Vec::with_capacity(config.row_len());
    let beg_take = &beg[..beg.len().min(config.beg_size)];
    row.extend(beg_take.iter().map(|&b| i32::from(b)));
    row.resize(config.beg_size, config.padding_token);
    // Too few bytes survive the stripping: the model would see mostly padding.
    if row[config.min_file_size_for_dl - 1] == config.padding_token {
        return Features::TooFew(&file[..block]);
    }

    let end_take = &end[end.len() - end.len().min(config.end_size)..];
    row.extend(std::iter::repeat_n(config.padding_token, config.end_size - end_take.len()));
    row.extend(end_take.iter().map(|&b| i32::from(b)));
    Features::Model(row)
}
