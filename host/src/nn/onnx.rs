//! What an ONNX model asks of the file system and of memory, read before any engine sees it.
//!
//! ONNX lets a tensor keep its data in another file (`data_location = EXTERNAL`, with an
//! `external_data` entry naming the file) and lets an `EPContext` node name a compiled blob
//! on disk. An engine given such a model opens those files, relative to the model's directory
//! (or to the server's working directory for a model loaded from memory) or at an absolute
//! path: an uploaded model would read any file the server can. [`file_references`] walks
//! every tensor of a model (initializers, sparse initializers, constant attributes, nested
//! graphs of control-flow nodes, local functions, training graphs) and lists what it names.
//!
//! The walk reads the model's bytes in place, field by field, by the ONNX IR's published field
//! numbers (`onnx.proto`): it builds nothing per message, so what it holds does not grow with
//! the number of nodes, attributes or tensors, and every field it does not read, the weights
//! themselves included, is skipped without being copied.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use prost::encoding::decode_varint;

use crate::oip::wire::{Field, Fields, Value, WireError, submessage};

/// One file a model would make an engine open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReference {
    /// The tensor (or node) that names it.
    pub owner: String,
    /// The location as written in the model (empty when a tensor is marked external
    /// without naming a file).
    pub location: String,
}

/// Why a model's file references could not be read or are not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OnnxError {
    #[error("not an ONNX model: {0}")]
    Malformed(String),
    #[error(
        "the model keeps tensor '{owner}' in an external file; uploaded weights must embed every tensor \
         (save them with onnx.save_model(model, path, save_as_external_data=False))"
    )]
    ExternalData { owner: String },
    #[error("the model's external data for tensor '{owner}' must be a file inside the model's own directory")]
    OutsideModelDirectory { owner: String },
    #[error(
        "the model's local functions expand to {calls} calls, more than the {limit} a tenant's model may make \
         (the engine inlines each as it loads)"
    )]
    TooManyFunctionCalls { calls: u64, limit: u64 },
    #[error(
        "the model holds {count} initializers and constants (model-local functions expanded), more than the \
         {limit} a tenant's model may (the engine's load takes time quadratic in their number)"
    )]
    TooManyConstants { count: u64, limit: u64 },
    #[error(
        "the model's graphs have {count} {what}, more than the {limit} a tenant's model may (the engine's load \
         takes time quadratic in their number)"
    )]
    TooManyGraphValues { what: &'static str, count: u64, limit: u64 },
    #[error(
        "the model makes strings, sequences or maps ({owner}); a tenant's model may compute only tensors of \
         numbers (the engine holds a string's contents and a sequence's or map's elements outside the memory \
         that model runs may hold)"
    )]
    NotNumbers { owner: String },
    #[error("the model's graphs and calls of its local functions nest more than {limit} deep")]
    TooDeep { limit: u32 },
    #[error("the model defines more than {limit} local functions")]
    TooManyFunctions { limit: usize },
    #[error("the model names more than {limit} external files and blobs")]
    TooManyFileReferences { limit: usize },
    #[error(
        "the model uses {owner}, whose working memory lies outside the memory that model runs may hold and grows \
         past it with its inputs; a tenant's model may not"
    )]
    UnboundedOperator { owner: String },
    #[error(
        "the model uses {owner}, one of ONNX Runtime's own operators that has not been measured to work within the \
         memory that model runs may hold; a tenant's model may use ONNX's operators and, of ONNX Runtime's, those \
         measured (the README lists them; ONNX Runtime makes its fused forms from ONNX's operators as it loads)"
    )]
    UnmeasuredOperator { owner: String },
}

/// Calls of model-local functions a tenant's model may make once expanded. ONNX Runtime inlines
/// each call as it loads, in time about quadratic in their number: a function calling another
/// twice, sixteen deep (65,535 calls from 1,256 bytes), took 80 s of CPU (17 s with no
/// optimisation at all), twelve deep (4,095 calls) 0.3 s.
pub const MAX_TENANT_FUNCTION_CALLS: u64 = 4096;

/// Initializers and `Constant` nodes a tenant's model may hold (model-local functions
/// expanded). ONNX Runtime's load takes time quadratic in their number, used or not: 65,536
/// one-float initializers (1.3 MB of model) took 10.5 s of CPU, 16,384 0.34 s.
pub const MAX_TENANT_CONSTANTS: u64 = 16_384;

impl From<WireError> for OnnxError {
    fn from(error: WireError) -> Self {
        OnnxError::Malformed(error.0)
    }
}

fn malformed(what: impl std::fmt::Display) -> OnnxError {
    OnnxError::Malformed(what.to_string())
}

/// Graphs nested in nodes and calls of local functions, one within another, the walk follows
/// (it recurses, as engines do; ONNX Runtime's protobuf reader stops at 100 messages deep, about
/// 25 nested graphs).
const MAX_DEPTH: u32 = 64;

/// Local functions a model may define: the walk keeps each one's name and place.
const MAX_FUNCTIONS: usize = 65_536;

/// Files and blobs a model may name: the walk lists each.
const MAX_FILE_REFERENCES: usize = 65_536;

/// What the walk finds in a model's tensors.
#[derive(Default)]
struct Found {
    references: Vec<FileReference>,
    /// What its sparse tensors take once dense, as an engine makes them at load.
    sparse_dense_bytes: u64,
    /// The first tensor or node that makes strings, sequences or maps.
    not_numbers: Option<String>,
    /// The first node whose operator works in memory outside the cap ([`NodeHead::unbounded`]).
    unbounded: Option<String>,
    /// The first node of ONNX Runtime's own operators not among [`MEASURED_CONTRIB_OPERATORS`].
    unmeasured: Option<String>,
}

impl Found {
    /// Walk every tensor and node of the model: its graph, its local functions (their nodes
    /// and attribute defaults) and its training graphs.
    fn walk(onnx: &[u8]) -> Result<Self, OnnxError> {
        let mut found = Found::default();
        for field in Fields::of(onnx) {
            match field? {
                (MODEL_GRAPH, value) => found.graph(value.bytes()?, 0)?,
                (MODEL_TRAINING_INFO, value) => {
                    for field in Fields::of(value.bytes()?) {
                        if let (TRAINING_INITIALIZATION | TRAINING_ALGORITHM, value) = field? {
                            found.graph(value.bytes()?, 0)?;
                        }
                    }
                }
                (MODEL_FUNCTION, value) => {
                    for field in Fields::of(value.bytes()?) {
                        match field? {
                            (FUNCTION_NODE, value) => found.node(value.bytes()?, 0)?,
                            (FUNCTION_ATTRIBUTE_DEFAULT, value) => found.attribute(value.bytes()?, 0)?,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(found)
    }

    fn graph(&mut self, graph: &[u8], depth: u32) -> Result<(), OnnxError> {
        let depth = deeper(depth)?;
        for field in Fields::of(graph) {
            match field? {
                (GRAPH_NODE, value) => self.node(value.bytes()?, depth)?,
                (GRAPH_INITIALIZER, value) => {
                    self.tensor(Fields::of(value.bytes()?))?;
                }
                (GRAPH_SPARSE_INITIALIZER, value) => self.sparse(Fields::of(value.bytes()?))?,
                _ => {}
            }
        }
        Ok(())
    }

    fn node(&mut self, node: &[u8], depth: u32) -> Result<(), OnnxError> {
        let head = NodeHead::read(node)?;
        if head.op_type == EP_CONTEXT.as_bytes() {
            // Its `ep_cache_context` is a file path unless `embed_mode` is 1; no engine Sluice
            // runs needs one, so any such node counts as naming a file.
            let owner = format!("{} ({EP_CONTEXT})", String::from_utf8_lossy(head.name));
            self.reference(FileReference { owner, location: String::new() })?;
        }
        if self.not_numbers.is_none() && head.makes_non_numbers(node)? {
            self.not_numbers = Some(head.describe());
        }
        if self.unbounded.is_none() {
            self.unbounded = head.unbounded(node)?;
        }
        if self.unmeasured.is_none() && head.unmeasured() {
            self.unmeasured = Some(head.describe_with_domain());
        }
        for field in Fields::of(node) {
            if let (NODE_ATTRIBUTE, value) = field? {
                self.attribute(value.bytes()?, depth)?;
            }
        }
        Ok(())
    }

    fn attribute(&mut self, attribute: &[u8], depth: u32) -> Result<(), OnnxError> {
        let (mut tensor, mut sparse) = (false, false);
        for field in Fields::of(attribute) {
            match field? {
                (ATTRIBUTE_TENSOR, _) => tensor = true,
                (ATTRIBUTE_TENSORS, value) => {
                    self.tensor(Fields::of(value.bytes()?))?;
                }
                (ATTRIBUTE_SPARSE_TENSOR, _) => sparse = true,
                (ATTRIBUTE_SPARSE_TENSORS, value) => self.sparse(Fields::of(value.bytes()?))?,
                (ATTRIBUTE_GRAPH | ATTRIBUTE_GRAPHS, value) => self.graph(value.bytes()?, depth)?,
                _ => {}
            }
        }
        // A single tensor given more than once is one tensor, merged, as an engine reads it.
        if tensor {
            self.tensor(submessage(Fields::of(attribute), ATTRIBUTE_TENSOR))?;
        }
        if sparse {
            self.sparse(submessage(Fields::of(attribute), ATTRIBUTE_SPARSE_TENSOR))?;
        }
        Ok(())
    }

    /// A tensor, whose data type it returns.
    fn tensor<'a>(&mut self, fields: impl Iterator<Item = Field<'a>>) -> Result<Option<i32>, OnnxError> {
        let tensor = TensorHead::read(fields)?;
        let name = || String::from_utf8_lossy(tensor.name).into_owned();
        if self.not_numbers.is_none() && tensor.data_type == Some(STRING) {
            self.not_numbers = Some(format!("tensor '{}'", shorten(&name())));
        }
        if tensor.external {
            let location = tensor.location.map(|location| String::from_utf8_lossy(location).into_owned());
            self.reference(FileReference { owner: name(), location: location.unwrap_or_default() })?;
        }
        Ok(tensor.data_type)
    }

    /// A sparse tensor: its values and indices as tensors, and its size once dense (all of
    /// memory where a dimension is negative or the product overflows).
    fn sparse<'a>(&mut self, fields: impl Iterator<Item = Field<'a>> + Clone) -> Result<(), OnnxError> {
        let (mut values, mut indices, mut elements) = (false, false, Some(1u64));
        let mut times = |dim: u64| elements = elements.and_then(|e| e.checked_mul(u64::try_from(dim as i64).ok()?));
        for field in fields.clone() {
            match field? {
                (SPARSE_VALUES, _) => values = true,
                (SPARSE_INDICES, _) => indices = true,
                (SPARSE_DIMS, Value::Varint(dim)) => times(dim),
                (SPARSE_DIMS, Value::Bytes(mut packed)) => {
                    while !packed.is_empty() {
                        times(decode_varint(&mut packed).map_err(malformed)?);
                    }
                }
                (SPARSE_DIMS, Value::Fixed) => return Err(malformed("a sparse tensor's dimension is not a varint")),
                _ => {}
            }
        }
        let mut data_type = None;
        if values {
            data_type = self.tensor(submessage(fields.clone(), SPARSE_VALUES))?;
        }
        if indices {
            self.tensor(submessage(fields, SPARSE_INDICES))?;
        }
        let dense = elements.and_then(|elements| elements.checked_mul(element_bytes(data_type.unwrap_or(0))));
        self.sparse_dense_bytes = self.sparse_dense_bytes.saturating_add(dense.unwrap_or(u64::MAX));
        Ok(())
    }

    fn reference(&mut self, reference: FileReference) -> Result<(), OnnxError> {
        if self.references.len() >= MAX_FILE_REFERENCES {
            return Err(OnnxError::TooManyFileReferences { limit: MAX_FILE_REFERENCES });
        }
        self.references.push(reference);
        Ok(())
    }
}

/// Every file the model names, in the order met.
pub fn file_references(onnx: &[u8]) -> Result<Vec<FileReference>, OnnxError> {
    Found::walk(onnx).map(|found| found.references)
}

/// What a model asks of the engine that loads it, read before any engine sees it.
pub struct Inspection {
    bytes: u64,
    found: Found,
    expanded: Expanded,
}

/// Read the model (its tensors, graphs and functions; not its weights' data).
pub fn inspect(onnx: &[u8]) -> Result<Inspection, OnnxError> {
    Ok(Inspection { bytes: onnx.len() as u64, found: Found::walk(onnx)?, expanded: expand(onnx)? })
}

impl Inspection {
    /// The bytes an engine holds for the model as it loads: its own, what its sparse tensors
    /// take once dense, and [`NODE_BYTES`] for each node it builds, model-local functions
    /// inlined. A sparse tensor names its dense shape and the few values set: ONNX Runtime makes
    /// it dense at load, so 206 bytes asking for 2^28 floats grew the server by 3 GiB before its
    /// memory was measured (e2e `resources::a_sparse_tensor_counts_at_its_dense_size_before_any_engine_sees_it`).
    /// A function whose body calls another twice, sixteen deep, is 1,256 bytes and 32,768 nodes
    /// once inlined, as ONNX Runtime does at load: 80 s of CPU (`resources::nested_functions_count_as_the_nodes_they_expand_to`).
    /// Each graph input, output and value annotation, each dimension of their shapes and each
    /// node attribute is also an object of the engine's, tens of times its bytes in the model
    /// (ONNX Runtime 1.32: 400,000 graph inputs, 8.7 MB of model, grew a process by 719 MiB).
    pub fn loaded_bytes(&self) -> u64 {
        let Expanded { nodes, values, dims, attributes, .. } = self.expanded;
        let objects = [(nodes, NODE_BYTES), (values, VALUE_BYTES), (dims, DIM_BYTES), (attributes, ATTRIBUTE_BYTES)];
        let objects = objects.iter().fold(0u64, |sum, (count, bytes)| sum.saturating_add(count.saturating_mul(*bytes)));
        self.bytes.saturating_add(self.found.sparse_dense_bytes).saturating_add(objects)
    }

    /// Refuse a model a tenant uploads or a guest loads from bytes that names any file, makes
    /// strings, sequences or maps, uses an operator that works outside the cap
    /// ([`NodeHead::unbounded`]), or, once its local functions are expanded, makes more than
    /// [`MAX_TENANT_FUNCTION_CALLS`] calls, has more than [`MAX_TENANT_GRAPH_VALUES`] graph
    /// inputs or outputs or holds more than [`MAX_TENANT_CONSTANTS`] constants. ONNX Runtime keeps a string's contents and a
    /// sequence's elements in the process's heap, outside its capped arena (`--run-memory`, which
    /// sees 32 bytes a string and nothing of an empty tensor): under a 64 MiB cap, a 1,607-byte
    /// graph doubling a one-letter string thirty times grew the server by 2 GiB in one run, and a
    /// split of an empty tensor into a million pieces by 249 MiB (e2e
    /// `resources::a_tenants_graph_may_not_hold_memory_that_no_cap_sees`).
    pub fn check_tenant(&self) -> Result<(), OnnxError> {
        if let Some(reference) = self.found.references.first() {
            return Err(OnnxError::ExternalData { owner: shorten(&reference.owner) });
        }
        if let Some(owner) = &self.found.not_numbers {
            return Err(OnnxError::NotNumbers { owner: owner.clone() });
        }
        if let Some(owner) = &self.found.unbounded {
            return Err(OnnxError::UnboundedOperator { owner: owner.clone() });
        }
        if let Some(owner) = &self.found.unmeasured {
            return Err(OnnxError::UnmeasuredOperator { owner: owner.clone() });
        }
        let Expanded { calls, constants, inputs, outputs, .. } = self.expanded;
        if calls > MAX_TENANT_FUNCTION_CALLS {
            return Err(OnnxError::TooManyFunctionCalls { calls, limit: MAX_TENANT_FUNCTION_CALLS });
        }
        for (what, count) in [("inputs", inputs), ("outputs", outputs)] {
            if count > MAX_TENANT_GRAPH_VALUES {
                return Err(OnnxError::TooManyGraphValues { what, count, limit: MAX_TENANT_GRAPH_VALUES });
            }
        }
        match constants > MAX_TENANT_CONSTANTS {
            true => Err(OnnxError::TooManyConstants { count: constants, limit: MAX_TENANT_CONSTANTS }),
            false => Ok(()),
        }
    }
}

/// What ONNX Runtime holds for a node of a loaded graph, about (its node, value and kernel
/// objects): a chain of 16,384 `Add`s grew the server by 70 MiB as it loaded.
pub const NODE_BYTES: u64 = 4 << 10;
/// ... for a graph input, output or value annotation: 400,000 graph inputs grew a process by
/// 719 MiB as it loaded (1.8 KiB each), 400,000 annotations by 267 MiB.
pub const VALUE_BYTES: u64 = 2 << 10;
/// ... for a dimension of a value's shape: two values of 100,000 dimensions each, 50 MiB.
pub const DIM_BYTES: u64 = 512;
/// ... for a node's attribute: a million on one node, 993 MiB.
pub const ATTRIBUTE_BYTES: u64 = 1 << 10;

/// Graph inputs, and graph outputs, of every graph a tenant's model holds, it may have each:
/// loading takes time quadratic in their number, in ONNX Runtime for outputs (25,000: 1.1 s,
/// 50,000: 3.4 s) and in `ort`'s session for both (which keeps each one's memory kind in a list
/// searched for its name: 100,000 inputs took the server 37 s of CPU, 100,000 outputs 43 s).
pub const MAX_TENANT_GRAPH_VALUES: u64 = 4096;

/// The nodes of the model's graph and of the graphs its nodes hold, with model-local functions
/// expanded, the calls of those functions made on the way, and the constants (initializers and
/// `Constant` nodes) among them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Expanded {
    nodes: u64,
    calls: u64,
    constants: u64,
    /// Graph inputs, outputs and value annotations.
    values: u64,
    /// The dimensions of their shapes.
    dims: u64,
    attributes: u64,
    inputs: u64,
    outputs: u64,
}

impl Expanded {
    /// Functions that call each other in a cycle: no end.
    const ENDLESS: Self = Self {
        nodes: u64::MAX,
        calls: u64::MAX,
        constants: u64::MAX,
        values: u64::MAX,
        dims: u64::MAX,
        attributes: u64::MAX,
        inputs: u64::MAX,
        outputs: u64::MAX,
    };

    fn add(self, other: Self) -> Self {
        Self {
            nodes: self.nodes.saturating_add(other.nodes),
            calls: self.calls.saturating_add(other.calls),
            constants: self.constants.saturating_add(other.constants),
            values: self.values.saturating_add(other.values),
            dims: self.dims.saturating_add(other.dims),
            attributes: self.attributes.saturating_add(other.attributes),
            inputs: self.inputs.saturating_add(other.inputs),
            outputs: self.outputs.saturating_add(other.outputs),
        }
    }
}

/// What the model's graph expands to; its local functions are read where they are called.
fn expand(onnx: &[u8]) -> Result<Expanded, OnnxError> {
    let mut functions = HashMap::new();
    let mut definitions = 0usize;
    for field in Fields::of(onnx) {
        if let (MODEL_FUNCTION, value) = field? {
            definitions += 1;
            if definitions > MAX_FUNCTIONS {
                return Err(OnnxError::TooManyFunctions { limit: MAX_FUNCTIONS });
            }
            let function = value.bytes()?;
            let (mut domain, mut name) = (&[][..], &[][..]);
            for field in Fields::of(function) {
                match field? {
                    (FUNCTION_NAME, value) => name = value.bytes()?,
                    (FUNCTION_DOMAIN, value) => domain = value.bytes()?,
                    _ => {}
                }
            }
            functions.insert((domain, name), function);
        }
    }
    let mut expansions = Expansions { functions, counted: HashMap::new() };
    let mut expanded = Expanded::default();
    for field in Fields::of(onnx) {
        if let (MODEL_GRAPH, value) = field? {
            expanded = expanded.add(expansions.graph(value.bytes()?, 0)?);
        }
    }
    Ok(expanded)
}

/// A function's key: its domain and name, as a node that calls it gives them.
type FunctionKey<'a> = (&'a [u8], &'a [u8]);

/// Model-local functions (their bytes) and what each expands to, counted once each.
struct Expansions<'a> {
    functions: HashMap<FunctionKey<'a>, &'a [u8]>,
    /// `None` while being counted: met again, it calls itself.
    counted: HashMap<FunctionKey<'a>, Option<Expanded>>,
}

impl<'a> Expansions<'a> {
    fn graph(&mut self, graph: &'a [u8], depth: u32) -> Result<Expanded, OnnxError> {
        let depth = deeper(depth)?;
        let mut sum = Expanded::default();
        for field in Fields::of(graph) {
            let value = |value: &'a [u8], inputs, outputs| -> Result<Expanded, OnnxError> {
                Ok(Expanded { values: 1, dims: dims(value)?, inputs, outputs, ..Expanded::default() })
            };
            let own = match field? {
                (GRAPH_NODE, node) => self.node(node.bytes()?, depth)?,
                (GRAPH_INITIALIZER | GRAPH_SPARSE_INITIALIZER, _) => Expanded { constants: 1, ..Expanded::default() },
                (GRAPH_INPUT, input) => value(input.bytes()?, 1, 0)?,
                (GRAPH_OUTPUT, output) => value(output.bytes()?, 0, 1)?,
                (GRAPH_VALUE_INFO, annotation) => value(annotation.bytes()?, 0, 0)?,
                _ => continue,
            };
            sum = sum.add(own);
        }
        Ok(sum)
    }

    fn node(&mut self, node: &'a [u8], depth: u32) -> Result<Expanded, OnnxError> {
        let head = NodeHead::read(node)?;
        let key = (head.domain, head.op_type);
        let call = self.functions.get(&key).copied();
        let mut sum = match call {
            None => Expanded { nodes: 1, constants: u64::from(head.op_type == b"Constant"), ..Expanded::default() },
            Some(function) => self.call(key, function, depth)?,
        };
        for field in Fields::of(node) {
            let (NODE_ATTRIBUTE, attribute) = field? else { continue };
            if call.is_none() {
                sum.attributes = sum.attributes.saturating_add(1);
            }
            for field in Fields::of(attribute.bytes()?) {
                if let (ATTRIBUTE_GRAPH | ATTRIBUTE_GRAPHS, graph) = field? {
                    sum = sum.add(self.graph(graph.bytes()?, depth)?);
                }
            }
        }
        Ok(sum)
    }

    /// What a call of the function `key` expands to: its nodes, expanded, and itself.
    fn call(&mut self, key: FunctionKey<'a>, function: &'a [u8], depth: u32) -> Result<Expanded, OnnxError> {
        match self.counted.get(&key) {
            Some(Some(counted)) => Ok(*counted),
            Some(None) => Ok(Expanded::ENDLESS),
            None => {
                let depth = deeper(depth)?;
                self.counted.insert(key, None);
                let mut body = Expanded { calls: 1, ..Expanded::default() };
                for field in Fields::of(function) {
                    if let (FUNCTION_NODE, node) = field? {
                        body = body.add(self.node(node.bytes()?, depth)?);
                    }
                }
                self.counted.insert(key, Some(body));
                Ok(body)
            }
        }
    }
}

/// The dimensions of a graph input's, output's or annotation's tensor shape.
fn dims(value: &[u8]) -> Result<u64, OnnxError> {
    let shape = submessage(submessage(submessage(Fields::of(value), VALUE_TYPE), TYPE_TENSOR), TENSOR_TYPE_SHAPE);
    let mut count = 0u64;
    for field in shape {
        if let (SHAPE_DIM, _) = field? {
            count += 1;
        }
    }
    Ok(count)
}

/// One level deeper into nested graphs and function calls, within [`MAX_DEPTH`].
fn deeper(depth: u32) -> Result<u32, OnnxError> {
    match depth < MAX_DEPTH {
        true => Ok(depth + 1),
        false => Err(OnnxError::TooDeep { limit: MAX_DEPTH }),
    }
}

/// Refuse a model that names any file.
pub fn check_self_contained(onnx: &[u8]) -> Result<(), OnnxError> {
    match file_references(onnx)?.into_iter().next() {
        None => Ok(()),
        Some(reference) => Err(OnnxError::ExternalData { owner: shorten(&reference.owner) }),
    }
}

/// For an operator's model file: whether it names files, each of which must lie inside
/// `model_file`'s own directory (a relative path of plain components that does not leave
/// it through a symbolic link either).
pub fn check_external_data_within(onnx: &[u8], model_file: &Path) -> Result<bool, OnnxError> {
    let references = file_references(onnx)?;
    let directory = model_file.parent().unwrap_or(Path::new("."));
    let canonical_directory = directory.canonicalize().ok();
    for reference in &references {
        let outside = || OnnxError::OutsideModelDirectory { owner: shorten(&reference.owner) };
        let relative = PathBuf::from(&reference.location);
        let plain = !reference.location.is_empty() && relative.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(outside());
        }
        let inside = match (directory.join(&relative).canonicalize(), &canonical_directory) {
            (Ok(file), Some(directory)) => file.starts_with(directory),
            _ => false,
        };
        if !inside {
            return Err(outside());
        }
    }
    Ok(!references.is_empty())
}

/// Names from a model are the uploader's text: keep them short in messages.
pub fn shorten(name: &str) -> String {
    const MAX: usize = 64;
    let mut cut = name.len().min(MAX);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let visible: String = name[..cut].chars().map(|c| if c.is_control() { '?' } else { c }).collect();
    if cut < name.len() { format!("{visible}…") } else { visible }
}

/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;
/// `TensorProto.DataType.STRING`.
const STRING: i32 = 8;
/// Operators whose working memory, outside ONNX Runtime's capped arena, is a multiple of their
/// inputs past any the cap allows for (ONNX Runtime 1.32): `RoiAlign` samples each region on a
/// grid as fine as the region is large (sampling_ratio 0) and precomputes every point of it, so
/// a 196-byte graph given one 8000×8000 region of an 8×8 image grew a process by 2.9 GiB in 2 s;
/// `NonZero` gathers 8 bytes per dimension for each non-zero element (4 MB of booleans reshaped
/// to rank 32 grew the server by 977 MiB under a 64 MiB cap, and a graph reshapes to any rank);
/// `Unique` ~30× and `DFT` ~17× the tensors they are given, which the cap, a quarter of the
/// machine's memory by default, lets be large enough to take the rest of it.
/// `NonMaxSuppression` lists each box it keeps, 24 bytes, before it makes its output: six times
/// its scores (one box scored in 12 million classes grew the server by 453 MiB under a 64 MiB
/// cap, then failed for its output). `DynamicTimeWarping` (ONNX Runtime's `com.microsoft`
/// domain) keeps its cost and trace matrices as two vectors a row, ~180 bytes a row of one
/// column: a matrix of 4 million rows grew the server by 688 MiB under a 64 MiB cap, answered.
/// `AffineGrid` builds its grid in the heap first, about four times its output: a 3-D grid of
/// 168³ grew the server by 263 MiB under a 64 MiB cap (a quarter of the machine's memory by
/// default, so four times it is more than the machine has).
const UNBOUNDED_OPERATORS: [&[u8]; 7] =
    [b"RoiAlign", b"NonZero", b"Unique", b"DFT", b"NonMaxSuppression", b"DynamicTimeWarping", b"AffineGrid"];
/// ONNX Runtime's own operators (its `com.microsoft` domain) a tenant's graph may use: those
/// measured with `scripts/ort_working_memory.py` (ONNX Runtime 1.32) to work within about the
/// cap, or refused by its arena first. Of the 86 it runs on the CPU, two measured so far work
/// outside the cap (`Unique`, `DynamicTimeWarping`: 11× it); the ones not measured (generation
/// loops, mixtures of experts, recurrent and state-space kernels, a tokenizer...) are refused
/// rather than trusted. Tenants' graphs need none of them: ONNX Runtime fuses ONNX's operators
/// into its own as it loads. Sorted, for the search.
const MEASURED_CONTRIB_OPERATORS: [&[u8]; 54] = [
    b"Attention",
    b"BiasGelu",
    b"CDist",
    b"ConvTransposeWithDynamicPads",
    b"CropAndResize",
    b"DecoderMaskedMultiHeadAttention",
    b"DequantizeLinear",
    b"DynamicQuantizeMatMul",
    b"EmbedLayerNormalization",
    b"ExpandDims",
    b"FastGelu",
    b"FusedConv",
    b"FusedGemm",
    b"FusedMatMul",
    b"GatherBlockQuantized",
    b"GatherND",
    b"Gelu",
    b"GridSample",
    b"GroupQueryAttention",
    b"Inverse",
    b"MatMulInteger16",
    b"MatMulIntegerToFloat",
    b"MatMulNBits",
    b"MaxpoolWithMask",
    b"MultiHeadAttention",
    b"MurmurHash3",
    b"NGramHashMapping",
    b"NGramRepeatBlock",
    b"NhwcMaxPool",
    b"Pad",
    b"QAttention",
    b"QGemm",
    b"QLinearAdd",
    b"QLinearAveragePool",
    b"QLinearConcat",
    b"QLinearConv",
    b"QLinearGlobalAveragePool",
    b"QLinearLeakyRelu",
    b"QLinearMul",
    b"QLinearSigmoid",
    b"QLinearSoftmax",
    b"QLinearWhere",
    b"QuantizeLinear",
    b"QuickGelu",
    b"Range",
    b"RotaryEmbedding",
    b"SampleOp",
    b"ScaledSiLU",
    b"SkipLayerNormalization",
    b"SkipSimplifiedLayerNormalization",
    b"TransposeMatMul",
    b"Trilu",
    b"UnfoldTensor",
    b"WordConvEmbedding",
];
/// ONNX Runtime's domain of its own operators.
const CONTRIB_DOMAIN: &[u8] = b"com.microsoft";
/// The prefixes of ONNX Runtime's layout domains (`com.microsoft.nchwc`,
/// `com.ms.internal.nhwc`): what its optimiser makes, none measured. A model-local function
/// named in one would not be called: ONNX Runtime runs its own operator of that name instead.
const RUNTIME_DOMAIN_PREFIXES: [&[u8]; 2] = [b"com.microsoft.", b"com.ms."];
/// The operators that resize images. In cubic mode without antialiasing (ONNX Runtime 1.32)
/// they keep each one-dimensional interpolation they compute in a hash map of the heap, ~50
/// bytes an entry, up to four entries for each element of their output: one row of 2 million
/// ones resized to four rows grew the server by 462 MiB under a 64 MiB cap, 13 times its output.
/// Linear, nearest and antialiased cubic modes work in the arena (measured).
const RESIZERS: [&[u8]; 2] = [b"Resize", b"Upsample"];
/// The operators that make a sequence or a map out of tensors.
const COLLECTION_MAKERS: [&[u8]; 4] = [b"SequenceConstruct", b"SequenceEmpty", b"SplitToSequence", b"ZipMap"];
/// The operator that runs a precompiled blob, which it may name as a file.
const EP_CONTEXT: &str = "EPContext";

// Field numbers of `onnx.proto` read here (from the ONNX IR's published definition).
const MODEL_GRAPH: u32 = 7;
const MODEL_TRAINING_INFO: u32 = 20;
const MODEL_FUNCTION: u32 = 25;
const TRAINING_INITIALIZATION: u32 = 1;
const TRAINING_ALGORITHM: u32 = 2;
const GRAPH_NODE: u32 = 1;
const GRAPH_INITIALIZER: u32 = 5;
const GRAPH_INPUT: u32 = 11;
const GRAPH_OUTPUT: u32 = 12;
const GRAPH_VALUE_INFO: u32 = 13;
const GRAPH_SPARSE_INITIALIZER: u32 = 15;
const VALUE_TYPE: u32 = 2;
const TYPE_TENSOR: u32 = 1;
const TENSOR_TYPE_SHAPE: u32 = 2;
const SHAPE_DIM: u32 = 1;
const NODE_NAME: u32 = 3;
const NODE_OP_TYPE: u32 = 4;
const NODE_ATTRIBUTE: u32 = 5;
const NODE_DOMAIN: u32 = 7;
const ATTRIBUTE_NAME: u32 = 1;
const ATTRIBUTE_INT: u32 = 3;
const ATTRIBUTE_STRING: u32 = 4;
const ATTRIBUTE_TENSOR: u32 = 5;
const ATTRIBUTE_GRAPH: u32 = 6;
const ATTRIBUTE_TENSORS: u32 = 10;
const ATTRIBUTE_GRAPHS: u32 = 11;
const ATTRIBUTE_REF_ATTR_NAME: u32 = 21;
const ATTRIBUTE_SPARSE_TENSOR: u32 = 22;
const ATTRIBUTE_SPARSE_TENSORS: u32 = 23;
const TENSOR_DATA_TYPE: u32 = 2;
const TENSOR_NAME: u32 = 8;
const TENSOR_EXTERNAL_DATA: u32 = 13;
const TENSOR_DATA_LOCATION: u32 = 14;
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;
const SPARSE_VALUES: u32 = 1;
const SPARSE_INDICES: u32 = 2;
const SPARSE_DIMS: u32 = 3;
const FUNCTION_NAME: u32 = 1;
const FUNCTION_NODE: u32 = 7;
const FUNCTION_DOMAIN: u32 = 10;
const FUNCTION_ATTRIBUTE_DEFAULT: u32 = 11;

/// A node's name, operator and domain (the last of each given, as protobuf keeps).
struct NodeHead<'a> {
    name: &'a [u8],
    op_type: &'a [u8],
    domain: &'a [u8],
}

impl<'a> NodeHead<'a> {
    fn read(node: &'a [u8]) -> Result<Self, OnnxError> {
        let mut head = NodeHead { name: &[], op_type: &[], domain: &[] };
        for field in Fields::of(node) {
            match field? {
                (NODE_NAME, value) => head.name = value.bytes()?,
                (NODE_OP_TYPE, value) => head.op_type = value.bytes()?,
                (NODE_DOMAIN, value) => head.domain = value.bytes()?,
                _ => {}
            }
        }
        Ok(head)
    }

    /// `node 'name' (OpType)`, for messages.
    fn describe(&self) -> String {
        let (name, op_type) = (String::from_utf8_lossy(self.name), String::from_utf8_lossy(self.op_type));
        format!("node '{}' ({})", shorten(&name), shorten(&op_type))
    }

    /// `node 'name' (domain OpType)`, for messages.
    fn describe_with_domain(&self) -> String {
        let (name, op_type) = (String::from_utf8_lossy(self.name), String::from_utf8_lossy(self.op_type));
        let domain = String::from_utf8_lossy(self.domain);
        format!("node '{}' ({} {})", shorten(&name), shorten(&domain), shorten(&op_type))
    }

    /// Whether the node calls one of ONNX Runtime's own operators that is not among
    /// [`MEASURED_CONTRIB_OPERATORS`], or any in its layout domains. A model-local function
    /// of the same domain and name does not count: ONNX Runtime runs its own operator instead.
    fn unmeasured(&self) -> bool {
        if self.domain == CONTRIB_DOMAIN {
            return MEASURED_CONTRIB_OPERATORS.binary_search(&self.op_type).is_err();
        }
        RUNTIME_DOMAIN_PREFIXES.iter().any(|prefix| self.domain.starts_with(prefix))
    }

    /// Whether the node `node` (read as `self`) makes strings, sequences or maps from tensors of
    /// numbers: a sequence or map maker, a cast to strings (or to a type its function's caller
    /// picks), a constant or label given as text or as a tensor of strings. Every other way to
    /// one starts from such a node or from an initializer of strings (`Found::tensor`).
    fn makes_non_numbers(&self, node: &'a [u8]) -> Result<bool, OnnxError> {
        if COLLECTION_MAKERS.contains(&self.op_type) {
            return Ok(true);
        }
        for field in Fields::of(node) {
            let (NODE_ATTRIBUTE, attribute) = field? else { continue };
            let attribute = AttributeHead::read(attribute.bytes()?)?;
            let makes_strings = match self.op_type {
                b"Cast" => attribute.name == b"to" && (attribute.from_caller || attribute.int == Some(STRING.into())),
                b"CastMap" => {
                    attribute.name == b"cast_to" && (attribute.from_caller || attribute.string == Some(b"TO_STRING"))
                }
                // `Constant`'s `value_string(s)`; the ML operators' `classlabels_strings`,
                // `cats_strings`, `keys_strings`, `values_strings`, `default_string`.
                _ => {
                    attribute.name.ends_with(b"_string")
                        || attribute.name.ends_with(b"_strings")
                        || attribute.tensor_of_strings
                }
            };
            if makes_strings {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The node `node` (read as `self`), described, if its operator works in memory outside
    /// the cap: one of [`UNBOUNDED_OPERATORS`], or a resize in cubic mode that does not
    /// antialias (its mode, or whether it antialiases, the function's caller picks: the same).
    fn unbounded(&self, node: &'a [u8]) -> Result<Option<String>, OnnxError> {
        if UNBOUNDED_OPERATORS.contains(&self.op_type) {
            return Ok(Some(self.describe()));
        }
        if !RESIZERS.contains(&self.op_type) {
            return Ok(None);
        }
        let (mut cubic, mut antialiased) = (false, false);
        for field in Fields::of(node) {
            let (NODE_ATTRIBUTE, attribute) = field? else { continue };
            let attribute = AttributeHead::read(attribute.bytes()?)?;
            match attribute.name {
                b"mode" => cubic = attribute.from_caller || attribute.string == Some(b"cubic"),
                // Only `Resize` antialiases (opset 18 on); `Upsample` has no such attribute.
                b"antialias" => {
                    antialiased = self.op_type == b"Resize" && !attribute.from_caller && attribute.int == Some(1)
                }
                _ => {}
            }
        }
        Ok((cubic && !antialiased).then(|| format!("{} in cubic mode without antialiasing", self.describe())))
    }
}

/// What an attribute says of the types a node makes.
struct AttributeHead<'a> {
    name: &'a [u8],
    int: Option<i64>,
    string: Option<&'a [u8]>,
    /// Inside a function: its value is the caller's attribute of that name.
    from_caller: bool,
    /// It holds a tensor, or a sparse tensor's values, of strings.
    tensor_of_strings: bool,
}

impl<'a> AttributeHead<'a> {
    fn read(attribute: &'a [u8]) -> Result<Self, OnnxError> {
        let mut head =
            AttributeHead { name: &[], int: None, string: None, from_caller: false, tensor_of_strings: false };
        let of_strings =
            |tensor: &'a [u8]| Ok::<_, OnnxError>(TensorHead::read(Fields::of(tensor))?.data_type == Some(STRING));
        for field in Fields::of(attribute) {
            match field? {
                (ATTRIBUTE_NAME, value) => head.name = value.bytes()?,
                (ATTRIBUTE_INT, value) => head.int = Some(value.int()?),
                (ATTRIBUTE_STRING, value) => head.string = Some(value.bytes()?),
                (ATTRIBUTE_REF_ATTR_NAME, value) => head.from_caller = !value.bytes()?.is_empty(),
                (ATTRIBUTE_TENSOR | ATTRIBUTE_TENSORS, value) => head.tensor_of_strings |= of_strings(value.bytes()?)?,
                (ATTRIBUTE_SPARSE_TENSOR | ATTRIBUTE_SPARSE_TENSORS, value) => {
                    for field in Fields::of(value.bytes()?) {
                        if let (SPARSE_VALUES, values) = field? {
                            head.tensor_of_strings |= of_strings(values.bytes()?)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(head)
    }
}

/// A tensor's name, type and where its data lies; not its data.
struct TensorHead<'a> {
    name: &'a [u8],
    data_type: Option<i32>,
    /// Its data is in a file: marked so, or given an external data entry.
    external: bool,
    /// The file its first `location` entry names.
    location: Option<&'a [u8]>,
}

impl<'a> TensorHead<'a> {
    fn read(fields: impl Iterator<Item = Field<'a>>) -> Result<Self, OnnxError> {
        let mut head = TensorHead { name: &[], data_type: None, external: false, location: None };
        let mut data_location = None;
        for field in fields {
            match field? {
                (TENSOR_NAME, value) => head.name = value.bytes()?,
                (TENSOR_DATA_TYPE, value) => head.data_type = Some(value.int()? as i32),
                (TENSOR_DATA_LOCATION, value) => data_location = Some(value.int()? as i32),
                (TENSOR_EXTERNAL_DATA, entry) => {
                    head.external = true;
                    let (mut key, mut value) = (&[][..], &[][..]);
                    for field in Fields::of(entry.bytes()?) {
                        match field? {
                            (ENTRY_KEY, text) => key = text.bytes()?,
                            (ENTRY_VALUE, text) => value = text.bytes()?,
                            _ => {}
                        }
                    }
                    if key == b"location" && head.location.is_none() {
                        head.location = Some(value);
                    }
                }
                _ => {}
            }
        }
        head.external |= data_location == Some(EXTERNAL);
        Ok(head)
    }
}

/// Bytes of one element of ONNX data type `data_type` (`TensorProto.DataType`) in memory;
/// strings and types unknown here count as 32 (a string object at least).
fn element_bytes(data_type: i32) -> u64 {
    match data_type {
        // UINT8, INT8, BOOL, the 8-bit floats, the 4-bit types (a byte each, dense).
        2 | 3 | 9 | 17..=23 => 1,
        // UINT16, INT16, FLOAT16, BFLOAT16.
        4 | 5 | 10 | 16 => 2,
        // FLOAT, INT32, UINT32.
        1 | 6 | 12 => 4,
        // INT64, DOUBLE, UINT64, COMPLEX64.
        7 | 11 | 13 | 14 => 8,
        // COMPLEX128.
        15 => 16,
        _ => 32,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost::encoding::WireType;

    use super::*;

    // Messages of `onnx.proto` to write test models with (the fields the walk reads).

    #[derive(Clone, PartialEq, Message)]
    struct ModelProto {
        #[prost(message, optional, tag = "7")]
        graph: Option<GraphProto>,
        #[prost(message, repeated, tag = "20")]
        training_info: Vec<TrainingInfoProto>,
        #[prost(message, repeated, tag = "25")]
        functions: Vec<FunctionProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct TrainingInfoProto {
        #[prost(message, optional, tag = "1")]
        initialization: Option<GraphProto>,
        #[prost(message, optional, tag = "2")]
        algorithm: Option<GraphProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct GraphProto {
        #[prost(message, repeated, tag = "1")]
        nodes: Vec<NodeProto>,
        #[prost(message, repeated, tag = "5")]
        initializers: Vec<TensorProto>,
        #[prost(message, repeated, tag = "11")]
        inputs: Vec<ValueInfoProto>,
        #[prost(message, repeated, tag = "12")]
        outputs: Vec<ValueInfoProto>,
        #[prost(message, repeated, tag = "13")]
        value_info: Vec<ValueInfoProto>,
        #[prost(message, repeated, tag = "15")]
        sparse_initializers: Vec<SparseTensorProto>,
    }

    /// A value's type, read only as far as a tensor's dimensions (their contents skipped).
    #[derive(Clone, PartialEq, Message)]
    struct ValueInfoProto {
        #[prost(message, optional, tag = "2")]
        r#type: Option<TypeProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct TypeProto {
        #[prost(message, optional, tag = "1")]
        tensor_type: Option<TypeProtoTensor>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct TypeProtoTensor {
        #[prost(message, optional, tag = "2")]
        shape: Option<TensorShapeProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct TensorShapeProto {
        #[prost(message, repeated, tag = "1")]
        dims: Vec<Dimension>,
    }

    /// A dimension, its value or name skipped.
    #[derive(Clone, PartialEq, Message)]
    struct Dimension {}

    #[derive(Clone, PartialEq, Message)]
    struct NodeProto {
        #[prost(bytes = "vec", tag = "3")]
        name: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        op_type: Vec<u8>,
        #[prost(message, repeated, tag = "5")]
        attributes: Vec<AttributeProto>,
        #[prost(bytes = "vec", tag = "7")]
        domain: Vec<u8>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct AttributeProto {
        #[prost(bytes = "vec", tag = "1")]
        name: Vec<u8>,
        #[prost(int64, optional, tag = "3")]
        i: Option<i64>,
        #[prost(bytes = "vec", optional, tag = "4")]
        s: Option<Vec<u8>>,
        #[prost(message, optional, tag = "5")]
        tensor: Option<TensorProto>,
        #[prost(message, optional, tag = "6")]
        graph: Option<GraphProto>,
        #[prost(message, repeated, tag = "10")]
        tensors: Vec<TensorProto>,
        #[prost(message, repeated, tag = "11")]
        graphs: Vec<GraphProto>,
        #[prost(message, optional, tag = "22")]
        sparse_tensor: Option<SparseTensorProto>,
        #[prost(message, repeated, tag = "23")]
        sparse_tensors: Vec<SparseTensorProto>,
        /// Inside a function: the caller's attribute this one takes its value from.
        #[prost(bytes = "vec", tag = "21")]
        ref_attr_name: Vec<u8>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct TensorProto {
        #[prost(int32, optional, tag = "2")]
        data_type: Option<i32>,
        #[prost(bytes = "vec", tag = "8")]
        name: Vec<u8>,
        #[prost(message, repeated, tag = "13")]
        external_data: Vec<StringStringEntryProto>,
        #[prost(int32, optional, tag = "14")]
        data_location: Option<i32>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct SparseTensorProto {
        #[prost(message, optional, tag = "1")]
        values: Option<TensorProto>,
        #[prost(message, optional, tag = "2")]
        indices: Option<TensorProto>,
        /// The dense shape.
        #[prost(int64, repeated, tag = "3")]
        dims: Vec<i64>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct FunctionProto {
        #[prost(bytes = "vec", tag = "1")]
        name: Vec<u8>,
        #[prost(message, repeated, tag = "7")]
        nodes: Vec<NodeProto>,
        #[prost(bytes = "vec", tag = "10")]
        domain: Vec<u8>,
        #[prost(message, repeated, tag = "11")]
        attribute_defaults: Vec<AttributeProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct StringStringEntryProto {
        #[prost(bytes = "vec", tag = "1")]
        key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        value: Vec<u8>,
    }

    fn loaded_bytes(onnx: &[u8]) -> Result<u64, OnnxError> {
        inspect(onnx).map(|inspection| inspection.loaded_bytes())
    }

    fn check_tenant_model(onnx: &[u8]) -> Result<(), OnnxError> {
        inspect(onnx)?.check_tenant()
    }

    fn entry(key: &str, value: &str) -> StringStringEntryProto {
        StringStringEntryProto { key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec() }
    }

    fn external(name: &str, location: &str) -> TensorProto {
        TensorProto {
            name: name.as_bytes().to_vec(),
            external_data: vec![entry("location", location), entry("offset", "0")],
            data_location: Some(EXTERNAL),
            data_type: None,
        }
    }

    fn embedded(name: &str) -> TensorProto {
        TensorProto { name: name.as_bytes().to_vec(), ..Default::default() }
    }

    fn model(graph: GraphProto) -> Vec<u8> {
        ModelProto { graph: Some(graph), training_info: Vec::new(), functions: Vec::new() }.encode_to_vec()
    }

    fn constant(tensor: TensorProto) -> NodeProto {
        let attribute = AttributeProto { tensor: Some(tensor), ..Default::default() };
        NodeProto {
            domain: Vec::new(),
            name: b"c".to_vec(),
            op_type: b"Constant".to_vec(),
            attributes: vec![attribute],
        }
    }

    #[test]
    fn the_digits_model_names_no_file() {
        let onnx = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/digits/model/digits.onnx"))
            .expect("the digits model");
        assert_eq!(file_references(&onnx), Ok(Vec::new()));
        assert_eq!(check_self_contained(&onnx), Ok(()));
    }

    #[test]
    fn sparse_tensors_count_at_their_dense_size_wherever_they_hide() {
        let floats = |dims: Vec<i64>| SparseTensorProto {
            values: Some(TensorProto { data_type: Some(1), ..embedded("v") }),
            indices: Some(embedded("i")),
            dims,
        };
        let initializer =
            GraphProto { sparse_initializers: vec![floats(vec![1 << 14, 1 << 14])], ..Default::default() };
        let onnx = model(initializer);
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + (1 << 30)), "2^28 floats, no node");
        // A Constant's sparse value inside a branch of an `If`.
        let sparse_constant = NodeProto {
            domain: Vec::new(),
            name: b"c".to_vec(),
            op_type: b"Constant".to_vec(),
            attributes: vec![AttributeProto { sparse_tensor: Some(floats(vec![1000])), ..Default::default() }],
        };
        let branch = GraphProto { nodes: vec![sparse_constant], ..Default::default() };
        let nested = GraphProto {
            nodes: vec![NodeProto {
                domain: Vec::new(),
                name: b"if".to_vec(),
                op_type: b"If".to_vec(),
                attributes: vec![AttributeProto { graph: Some(branch), ..Default::default() }],
            }],
            ..Default::default()
        };
        let onnx = model(nested);
        let two_nodes_of_an_attribute = 2 * (NODE_BYTES + ATTRIBUTE_BYTES);
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + 4000 + two_nodes_of_an_attribute));
        // Shapes that overflow or go negative take all of memory.
        for dims in [vec![1 << 40, 1 << 40], vec![-1, 4]] {
            let graph = GraphProto { sparse_initializers: vec![floats(dims)], ..Default::default() };
            assert_eq!(loaded_bytes(&model(graph)), Ok(u64::MAX));
        }
        let digits = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/digits/model/digits.onnx"))
            .expect("the digits model");
        // No sparse tensor; 12 nodes with 3 attributes among them, an input and two outputs with
        // 5 dimensions among them.
        let objects = 12 * NODE_BYTES + 3 * ATTRIBUTE_BYTES + 3 * VALUE_BYTES + 5 * DIM_BYTES;
        assert_eq!(loaded_bytes(&digits), Ok(digits.len() as u64 + objects));
    }

    #[test]
    fn a_tenants_model_may_not_make_strings_sequences_or_maps_wherever_they_start() {
        let op = |op_type: &str, attributes: Vec<AttributeProto>| NodeProto {
            domain: Vec::new(),
            name: b"n".to_vec(),
            op_type: op_type.as_bytes().to_vec(),
            attributes,
        };
        let int = |name: &str, i: i64| AttributeProto { name: name.into(), i: Some(i), ..Default::default() };
        let text = |name: &str, s: &str| AttributeProto { name: name.into(), s: Some(s.into()), ..Default::default() };
        let strings = || TensorProto { data_type: Some(STRING), ..embedded("labels") };
        let in_branch = |node: NodeProto| {
            let branch = GraphProto { nodes: vec![node], ..Default::default() };
            op("If", vec![AttributeProto { graph: Some(branch), ..Default::default() }])
        };
        let graph_of = |nodes: Vec<NodeProto>| model(GraphProto { nodes, ..Default::default() });
        let sparse_strings = SparseTensorProto { values: Some(strings()), indices: None, dims: vec![4] };
        let called = |body: NodeProto| {
            ModelProto {
                graph: Some(GraphProto { nodes: vec![op("F", vec![int("kind", 8)])], ..Default::default() }),
                training_info: Vec::new(),
                functions: vec![FunctionProto { nodes: vec![body], ..Default::default() }],
            }
            .encode_to_vec()
        };
        let cast_by_caller = op(
            "Cast",
            vec![AttributeProto { name: b"to".to_vec(), ref_attr_name: b"kind".to_vec(), ..Default::default() }],
        );
        let refused = [
            ("a string initializer", model(GraphProto { initializers: vec![strings()], ..Default::default() })),
            ("a sparse one", model(GraphProto { sparse_initializers: vec![sparse_strings], ..Default::default() })),
            ("a constant of strings", graph_of(vec![constant(strings())])),
            ("a constant given as text", graph_of(vec![op("Constant", vec![text("value_string", "a")])])),
            ("a cast to strings in a branch", graph_of(vec![in_branch(op("Cast", vec![int("to", 8)]))])),
            ("a cast to the caller's type", called(cast_by_caller)),
            ("a map cast to strings", graph_of(vec![op("CastMap", vec![text("cast_to", "TO_STRING")])])),
            ("labels given as text", graph_of(vec![op("LabelEncoder", vec![text("values_strings", "cat")])])),
            ("a split into a sequence", graph_of(vec![in_branch(op("SplitToSequence", Vec::new()))])),
            ("an empty sequence", called(op("SequenceEmpty", Vec::new()))),
            ("a map of labels", graph_of(vec![op("ZipMap", vec![int("classlabels_int64s", 1)])])),
        ];
        for (what, onnx) in refused {
            assert!(matches!(check_tenant_model(&onnx), Err(OnnxError::NotNumbers { .. })), "{what}");
        }
        let regions = graph_of(vec![in_branch(op("RoiAlign", vec![int("sampling_ratio", 2)]))]);
        assert!(matches!(check_tenant_model(&regions), Err(OnnxError::UnboundedOperator { .. })));
        for operator in ["NonZero", "Unique", "DFT", "NonMaxSuppression", "DynamicTimeWarping", "AffineGrid"] {
            let used = called(op(operator, Vec::new()));
            assert!(matches!(check_tenant_model(&used), Err(OnnxError::UnboundedOperator { .. })), "{operator}");
        }
        let cubic = || text("mode", "cubic");
        let mode_by_caller =
            AttributeProto { name: b"mode".to_vec(), ref_attr_name: b"how".to_vec(), ..Default::default() };
        let antialias_by_caller =
            AttributeProto { name: b"antialias".to_vec(), ref_attr_name: b"smooth".to_vec(), ..Default::default() };
        let cubic_resizes = [
            ("a cubic resize", graph_of(vec![op("Resize", vec![cubic()])])),
            ("one in a branch", graph_of(vec![in_branch(op("Resize", vec![int("antialias", 0), cubic()]))])),
            ("a cubic upsample", graph_of(vec![op("Upsample", vec![cubic(), int("antialias", 1)])])),
            ("the caller's mode", called(op("Resize", vec![mode_by_caller]))),
            ("the caller's antialiasing", called(op("Resize", vec![cubic(), antialias_by_caller]))),
        ];
        for (what, onnx) in cubic_resizes {
            let message = check_tenant_model(&onnx).expect_err(what);
            assert!(matches!(message, OnnxError::UnboundedOperator { .. }), "{what}: {message}");
            assert!(message.to_string().contains("in cubic mode without antialiasing, whose"), "{message}");
        }
        let message =
            check_tenant_model(&graph_of(vec![in_branch(op("Cast", vec![int("to", 8)]))])).expect_err("refused");
        assert!(
            message.to_string().starts_with("the model makes strings, sequences or maps (node 'n' (Cast))"),
            "{message}"
        );
        let message = check_tenant_model(&graph_of(vec![constant(strings())])).expect_err("refused");
        assert!(
            message.to_string().starts_with("the model makes strings, sequences or maps (node 'c' (Constant))"),
            "{message}"
        );
        // Numbers only: a cast to floats, a map cast to floats, labels as integers, an LSTM's
        // activations named as text, a split into tensors.
        let allowed = [
            graph_of(vec![op("Cast", vec![int("to", 1)])]),
            called(op("Cast", vec![int("to", 1)])),
            graph_of(vec![op("CastMap", vec![text("cast_to", "TO_FLOAT")])]),
            graph_of(vec![op("LabelEncoder", vec![int("values_int64s", 1)])]),
            graph_of(vec![op("LSTM", vec![text("activations", "Tanh")])]),
            graph_of(vec![op("Split", Vec::new())]),
            // Resizes that work in the arena: nearest (the default), linear, antialiased cubic.
            graph_of(vec![op("Resize", Vec::new())]),
            graph_of(vec![op("Upsample", vec![text("mode", "linear")])]),
            called(op("Resize", vec![int("antialias", 1), text("mode", "cubic")])),
        ];
        for onnx in allowed {
            assert_eq!(check_tenant_model(&onnx), Ok(()));
        }
        let digits = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/digits/model/digits.onnx"))
            .expect("the digits model");
        assert_eq!(check_tenant_model(&digits), Ok(()));
    }

    #[test]
    fn of_onnx_runtimes_own_operators_only_the_measured_pass() {
        assert!(MEASURED_CONTRIB_OPERATORS.windows(2).all(|pair| pair[0] < pair[1]), "sorted, for the search");
        let op = |domain: &str, op_type: &str| NodeProto {
            domain: domain.as_bytes().to_vec(),
            name: b"n".to_vec(),
            op_type: op_type.as_bytes().to_vec(),
            attributes: Vec::new(),
        };
        let in_branch = |node: NodeProto| {
            let branch = GraphProto { nodes: vec![node], ..Default::default() };
            NodeProto { attributes: vec![AttributeProto { graph: Some(branch), ..Default::default() }], ..op("", "If") }
        };
        let graph_of = |nodes: Vec<NodeProto>| model(GraphProto { nodes, ..Default::default() });
        // A model-local function is called by its domain and name; one named as ONNX Runtime
        // names its own operator is not called (ONNX Runtime runs its own), so counts as that.
        let with_function = |call: NodeProto, body: NodeProto| {
            let function = FunctionProto {
                name: call.op_type.clone(),
                domain: call.domain.clone(),
                nodes: vec![body],
                attribute_defaults: Vec::new(),
            };
            ModelProto {
                graph: Some(GraphProto { nodes: vec![call], ..Default::default() }),
                training_info: Vec::new(),
                functions: vec![function],
            }
            .encode_to_vec()
        };
        let refused = [
            ("a generation loop", graph_of(vec![op("com.microsoft", "BeamSearch")])),
            ("a mixture of experts in a branch", graph_of(vec![in_branch(op("com.microsoft", "MoE"))])),
            ("a layout operator", graph_of(vec![op("com.microsoft.nchwc", "Conv")])),
            ("an internal one", graph_of(vec![op("com.ms.internal.nhwc", "MaxPool")])),
            ("one in a function", with_function(op("local", "f"), op("com.microsoft", "Tokenizer"))),
            ("a function named as one", with_function(op("com.microsoft", "Sampling"), op("", "Neg"))),
        ];
        for (what, onnx) in refused {
            let message = check_tenant_model(&onnx).expect_err(what);
            assert!(matches!(message, OnnxError::UnmeasuredOperator { .. }), "{what}: {message}");
        }
        let message = check_tenant_model(&graph_of(vec![op("com.microsoft", "BeamSearch")])).expect_err("refused");
        assert!(
            message.to_string().starts_with("the model uses node 'n' (com.microsoft BeamSearch), one of"),
            "{message}"
        );
        let allowed = [
            graph_of(vec![op("com.microsoft", "FusedMatMul"), op("com.microsoft", "SkipLayerNormalization")]),
            graph_of(vec![in_branch(op("com.microsoft", "MatMulNBits"))]),
            with_function(op("local", "f"), op("com.microsoft", "Gelu")),
            // ONNX's own operators, by either of their domain's names.
            graph_of(vec![op("ai.onnx", "MatMul"), op("ai.onnx.ml", "TreeEnsembleRegressor")]),
        ];
        for onnx in allowed {
            assert_eq!(check_tenant_model(&onnx), Ok(()));
        }
    }

    #[test]
    fn functions_count_as_the_nodes_they_expand_to() {
        let call = |op: &str| NodeProto {
            domain: b"local".to_vec(),
            op_type: op.as_bytes().to_vec(),
            name: Vec::new(),
            attributes: Vec::new(),
        };
        let add = NodeProto { domain: Vec::new(), op_type: b"Add".to_vec(), name: Vec::new(), attributes: Vec::new() };
        // f0 calls f1 twice, ..., f15 is one Add: 2^15 nodes once inlined.
        let functions = (0..16)
            .map(|level| FunctionProto {
                name: format!("f{level}").into_bytes(),
                domain: b"local".to_vec(),
                nodes: match level {
                    15 => vec![add.clone()],
                    _ => vec![call(&format!("f{}", level + 1)); 2],
                },
                attribute_defaults: Vec::new(),
            })
            .collect::<Vec<_>>();
        let graph = GraphProto { nodes: vec![call("f0"), add.clone()], ..Default::default() };
        let nested = ModelProto { graph: Some(graph), training_info: Vec::new(), functions: functions.clone() };
        let onnx = nested.encode_to_vec();
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + ((1 << 15) + 1) * NODE_BYTES));
        let too_many = OnnxError::TooManyFunctionCalls { calls: (1 << 16) - 1, limit: MAX_TENANT_FUNCTION_CALLS };
        assert_eq!(check_tenant_model(&onnx), Err(too_many));
        // Twelve deep: 4,095 calls, a tenant's model may make them.
        let mut twelve = nested.clone();
        twelve.functions.truncate(12);
        twelve.functions[11].nodes = vec![add.clone()];
        let onnx = twelve.encode_to_vec();
        assert_eq!(check_tenant_model(&onnx), Ok(()));
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + ((1 << 11) + 1) * NODE_BYTES));
        // A function that calls itself takes all of memory.
        let mut looped = functions;
        looped[15].nodes = vec![call("f3")];
        let graph = GraphProto { nodes: vec![call("f0")], ..Default::default() };
        let onnx = ModelProto { graph: Some(graph), training_info: Vec::new(), functions: looped }.encode_to_vec();
        assert_eq!(loaded_bytes(&onnx), Ok(u64::MAX));
        assert!(check_tenant_model(&onnx).is_err());
    }

    #[test]
    fn initializers_and_constants_are_counted_wherever_they_hide() {
        let constant_node = constant(embedded("c"));
        let call =
            NodeProto { domain: b"local".to_vec(), op_type: b"f".to_vec(), name: Vec::new(), attributes: Vec::new() };
        // Two constants in a function called 4,096 times, 8,000 initializers in an `If`'s branch,
        // and in the main graph 96 initializers, 96 sparse ones and one `Constant`: one too many.
        let function = FunctionProto {
            name: b"f".to_vec(),
            domain: b"local".to_vec(),
            nodes: vec![constant_node.clone(); 2],
            attribute_defaults: Vec::new(),
        };
        let branch = GraphProto { initializers: vec![embedded("i"); 8000], ..Default::default() };
        let branching = NodeProto {
            domain: Vec::new(),
            name: b"if".to_vec(),
            op_type: b"If".to_vec(),
            attributes: vec![AttributeProto { graph: Some(branch), ..Default::default() }],
        };
        let sparse = SparseTensorProto { values: Some(embedded("v")), indices: None, dims: vec![1] };
        let mut nodes = vec![call; 4096];
        nodes.extend([branching, constant_node]);
        let graph = GraphProto {
            nodes,
            initializers: vec![embedded("w"); 96],
            sparse_initializers: vec![sparse; 96],
            ..Default::default()
        };
        let mut model = ModelProto { graph: Some(graph), training_info: Vec::new(), functions: vec![function] };
        let too_many = OnnxError::TooManyConstants { count: 16_385, limit: MAX_TENANT_CONSTANTS };
        assert_eq!(check_tenant_model(&model.encode_to_vec()), Err(too_many));
        model.graph.as_mut().map(|graph| graph.sparse_initializers.pop());
        assert_eq!(check_tenant_model(&model.encode_to_vec()), Ok(()));
    }

    #[test]
    fn values_dimensions_and_attributes_count_and_inputs_and_outputs_are_bounded() {
        let value = |dims: usize| ValueInfoProto {
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor { shape: Some(TensorShapeProto { dims: vec![Dimension {}; dims] }) }),
            }),
        };
        let node = NodeProto {
            domain: Vec::new(),
            name: b"n".to_vec(),
            op_type: b"Identity".to_vec(),
            attributes: vec![AttributeProto::default(); 1000],
        };
        let graph = GraphProto {
            nodes: vec![node],
            inputs: vec![value(100_000)],
            outputs: vec![value(0); 2],
            value_info: vec![value(1); 10],
            ..Default::default()
        };
        let onnx = model(graph.clone());
        let objects = NODE_BYTES + 1000 * ATTRIBUTE_BYTES + 13 * VALUE_BYTES + 100_010 * DIM_BYTES;
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + objects));
        assert_eq!(check_tenant_model(&onnx), Ok(()));
        // Inputs and outputs are counted in every graph: the main graph's and an `If`'s branch's.
        let branch = GraphProto { inputs: vec![value(0); 4095], outputs: vec![value(0); 4095], ..Default::default() };
        let branching = NodeProto {
            domain: Vec::new(),
            name: b"if".to_vec(),
            op_type: b"If".to_vec(),
            attributes: vec![AttributeProto { graph: Some(branch), ..Default::default() }],
        };
        let onnx = model(GraphProto { nodes: vec![branching.clone()], outputs: vec![value(0)], ..graph.clone() });
        assert_eq!(check_tenant_model(&onnx), Ok(()), "4,096 inputs and 4,096 outputs");
        let onnx = model(GraphProto { nodes: vec![branching.clone()], ..graph.clone() });
        let too_many = OnnxError::TooManyGraphValues { what: "outputs", count: 4097, limit: MAX_TENANT_GRAPH_VALUES };
        assert_eq!(check_tenant_model(&onnx), Err(too_many));
        let onnx =
            model(GraphProto { nodes: vec![branching], inputs: vec![value(0); 2], outputs: vec![value(0)], ..graph });
        let too_many = OnnxError::TooManyGraphValues { what: "inputs", count: 4097, limit: MAX_TENANT_GRAPH_VALUES };
        assert_eq!(check_tenant_model(&onnx), Err(too_many));
    }

    /// Field `tag` holding `message`'s bytes as they are.
    fn field(tag: u32, message: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        prost::encoding::encode_key(tag, WireType::LengthDelimited, &mut bytes);
        prost::encoding::encode_varint(message.len() as u64, &mut bytes);
        bytes.extend_from_slice(message);
        bytes
    }

    #[test]
    fn a_tensor_given_twice_is_one_tensor_merged_as_an_engine_reads_it() {
        // A `Constant` whose one sparse tensor is given twice, with half its shape each: an engine
        // joins them into one of 65,536 x 65,536 floats, so that is what it counts at.
        let constant_of = |attribute: &[u8]| {
            let mut node = NodeProto { attributes: Vec::new(), ..constant(embedded("c")) }.encode_to_vec();
            node.extend(field(NODE_ATTRIBUTE, attribute));
            field(MODEL_GRAPH, &field(GRAPH_NODE, &node))
        };
        let sparse = |data_type, dims| {
            let values = Some(TensorProto { data_type: Some(data_type), ..embedded("v") });
            AttributeProto {
                sparse_tensor: Some(SparseTensorProto { values, indices: None, dims }),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let mut attribute = sparse(1, vec![65_536]);
        attribute.extend(sparse(1, vec![65_536]));
        let onnx = constant_of(&attribute);
        let objects = NODE_BYTES + ATTRIBUTE_BYTES;
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + (4 << 32) + objects));
        // Its values' type is the last given (a string counts as 32 bytes), and they are strings.
        attribute.extend(sparse(STRING, vec![1]));
        let onnx = constant_of(&attribute);
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + (32 << 32) + objects));
        assert!(matches!(check_tenant_model(&onnx), Err(OnnxError::NotNumbers { .. })));
    }

    #[test]
    fn graphs_and_calls_nest_at_most_64_deep() {
        let nested = |depth: usize| {
            let mut graph = GraphProto { nodes: vec![constant(embedded("c"))], ..Default::default() };
            for _ in 1..depth {
                let attribute = AttributeProto { graph: Some(graph), ..Default::default() };
                let node = NodeProto {
                    domain: Vec::new(),
                    name: b"if".to_vec(),
                    op_type: b"If".to_vec(),
                    attributes: vec![attribute],
                };
                graph = GraphProto { nodes: vec![node], ..Default::default() };
            }
            model(graph)
        };
        assert!(loaded_bytes(&nested(64)).is_ok());
        assert_eq!(loaded_bytes(&nested(65)).map(drop), Err(OnnxError::TooDeep { limit: MAX_DEPTH }));
        // A chain of functions each calling the next: a call is a level too.
        let chain = |length: usize| {
            let call = |index: usize| NodeProto {
                domain: b"local".to_vec(),
                name: Vec::new(),
                op_type: format!("f{index}").into_bytes(),
                attributes: Vec::new(),
            };
            let function = |index: usize| FunctionProto {
                name: format!("f{index}").into_bytes(),
                domain: b"local".to_vec(),
                nodes: vec![if index + 1 < length { call(index + 1) } else { constant(embedded("c")) }],
                attribute_defaults: Vec::new(),
            };
            let graph = GraphProto { nodes: vec![call(0)], ..Default::default() };
            ModelProto { graph: Some(graph), training_info: Vec::new(), functions: (0..length).map(function).collect() }
                .encode_to_vec()
        };
        // Calls build no node of their own: 63 deep, the one `Constant` at the end.
        let deepest = chain(63);
        assert_eq!(loaded_bytes(&deepest), Ok(deepest.len() as u64 + NODE_BYTES + ATTRIBUTE_BYTES));
        assert_eq!(loaded_bytes(&chain(100_000)).map(drop), Err(OnnxError::TooManyFunctions { limit: MAX_FUNCTIONS }));
        assert_eq!(loaded_bytes(&chain(60_000)).map(drop), Err(OnnxError::TooDeep { limit: MAX_DEPTH }));
    }

    #[test]
    fn malformed_bytes_are_refused_with_what_is_wrong() {
        for (bytes, expected) in [
            (&[0x3a, 0x05, 0x01][..], "runs past the end"),
            (&[0x38, 0x01][..], "holds a number"),
            (&[0x3b][..], "a group field"),
            (&[0xff][..], "varint"),
        ] {
            match inspect(bytes).map(drop) {
                Err(OnnxError::Malformed(message)) => assert!(message.contains(expected), "{message}"),
                other => panic!("{bytes:?}: {:?}", other.map_err(|e| e.to_string())),
            }
        }
    }

    #[test]
    fn external_tensors_are_found_wherever_they_hide() {
        let initializer =
            GraphProto { initializers: vec![embedded("w"), external("a", "x.bin")], ..Default::default() };
        let in_a_constant = GraphProto { nodes: vec![constant(external("b", "/etc/passwd"))], ..Default::default() };
        let sparse =
            SparseTensorProto { values: Some(external("c", "../y")), indices: Some(embedded("i")), dims: Vec::new() };
        let in_a_sparse_initializer = GraphProto { sparse_initializers: vec![sparse], ..Default::default() };
        // A branch of an `If`, three graphs deep.
        let inner = GraphProto { nodes: vec![constant(external("d", "z"))], ..Default::default() };
        let middle = GraphProto {
            nodes: vec![NodeProto {
                domain: Vec::new(),
                name: b"if".to_vec(),
                op_type: b"If".to_vec(),
                attributes: vec![AttributeProto { graphs: vec![inner], ..Default::default() }],
            }],
            ..Default::default()
        };
        let nested = GraphProto {
            nodes: vec![NodeProto {
                domain: Vec::new(),
                name: b"loop".to_vec(),
                op_type: b"Loop".to_vec(),
                attributes: vec![AttributeProto { graph: Some(middle), ..Default::default() }],
            }],
            ..Default::default()
        };
        // Marked external without naming a file still counts.
        let unnamed = GraphProto {
            initializers: vec![TensorProto { name: b"e".to_vec(), data_location: Some(1), ..Default::default() }],
            ..Default::default()
        };
        for (graph, owner) in
            [(initializer, "a"), (in_a_constant, "b"), (in_a_sparse_initializer, "c"), (nested, "d"), (unnamed, "e")]
        {
            let references = file_references(&model(graph)).expect("decodes");
            assert_eq!(references.iter().map(|r| r.owner.as_str()).collect::<Vec<_>>(), [owner]);
            assert_eq!(check_self_contained(&model(GraphProto::default())), Ok(()));
        }
    }

    #[test]
    fn functions_training_graphs_and_ep_context_nodes_count() {
        let function = FunctionProto {
            name: b"f".to_vec(),
            domain: b"local".to_vec(),
            nodes: vec![constant(external("f", "f.bin"))],
            attribute_defaults: Vec::new(),
        };
        let training = TrainingInfoProto {
            initialization: Some(GraphProto { initializers: vec![external("t", "t.bin")], ..Default::default() }),
            algorithm: None,
        };
        let ep_context =
            NodeProto { domain: Vec::new(), name: b"ctx".to_vec(), op_type: EP_CONTEXT.into(), attributes: Vec::new() };
        let onnx = ModelProto {
            graph: Some(GraphProto { nodes: vec![ep_context], ..Default::default() }),
            training_info: vec![training],
            functions: vec![function],
        }
        .encode_to_vec();
        let owners: Vec<String> = file_references(&onnx).expect("decodes").into_iter().map(|r| r.owner).collect();
        assert_eq!(owners, ["ctx (EPContext)", "t", "f"], "in the order of the model's bytes");
        let refused = check_self_contained(&onnx).expect_err("refused");
        assert!(refused.to_string().contains("save_as_external_data=False"), "{refused}");
    }

    #[test]
    fn garbage_is_not_a_model() {
        assert!(matches!(file_references(&[0xff; 16]), Err(OnnxError::Malformed(_))));
    }

    #[test]
    fn operator_models_may_name_files_only_inside_their_directory() {
        let dir = tempfile::tempdir().expect("tmp");
        let model_file = dir.path().join("model.onnx");
        std::fs::write(dir.path().join("weights.bin"), b"w").expect("weights");
        std::fs::create_dir(dir.path().join("sub")).expect("sub");
        std::fs::write(dir.path().join("sub/more.bin"), b"w").expect("weights");
        let outside = tempfile::tempdir().expect("tmp");
        std::fs::write(outside.path().join("secret"), b"s").expect("secret");
        #[cfg(unix)]
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link.bin")).expect("symlink");
        let with =
            |location: &str| model(GraphProto { initializers: vec![external("w", location)], ..Default::default() });

        assert_eq!(check_external_data_within(&with("weights.bin"), &model_file), Ok(true));
        assert_eq!(check_external_data_within(&with("sub/more.bin"), &model_file), Ok(true));
        assert_eq!(check_external_data_within(&model(GraphProto::default()), &model_file), Ok(false));
        let secret = outside.path().join("secret");
        for location in
            ["../secret", secret.to_str().expect("utf-8"), "", "missing.bin", "link.bin", "sub/../weights.bin"]
        {
            let refused = check_external_data_within(&with(location), &model_file);
            assert!(matches!(refused, Err(OnnxError::OutsideModelDirectory { .. })), "{location}: {refused:?}");
        }
    }

    #[test]
    fn long_or_odd_names_are_cut_in_messages() {
        let name = format!("line\nbreak{}", "x".repeat(200));
        let shown = shorten(&name);
        assert!(shown.starts_with("line?break") && shown.ends_with('…') && shown.chars().count() <= 65, "{shown}");
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// A graph `depth` control-flow levels deep whose innermost constant may be external.
        fn nested(depth: usize, external_at_bottom: bool) -> GraphProto {
            let bottom = if external_at_bottom { external("deep", "f") } else { embedded("deep") };
            let mut graph = GraphProto { nodes: vec![constant(bottom)], ..Default::default() };
            for _ in 0..depth {
                let attribute = AttributeProto { graph: Some(graph), ..Default::default() };
                graph = GraphProto {
                    nodes: vec![NodeProto {
                        domain: Vec::new(),
                        name: b"if".to_vec(),
                        op_type: b"If".to_vec(),
                        attributes: vec![attribute],
                    }],
                    ..Default::default()
                };
            }
            graph
        }

        proptest! {
            /// Any bytes are a model or not; the walk never panics.
            #[test]
            fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let _ = file_references(&bytes);
            }

            /// An external tensor is found however deep in nested graphs it hides.
            #[test]
            fn external_data_is_found_at_any_depth(depth in 0usize..20, external in any::<bool>()) {
                let found = file_references(&model(nested(depth, external))).expect("decodes");
                prop_assert_eq!(found.len(), usize::from(external));
            }
        }
    }
}
