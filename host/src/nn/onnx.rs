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
//! The walk decodes only the fields that can hold a tensor or a graph, with messages written
//! here from the ONNX IR's published field numbers (`onnx.proto`); every other field, the
//! weights themselves included, is skipped without being copied.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use prost::Message;

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
        "the model makes strings, sequences or maps ({owner}); a tenant's model may compute only tensors of \
         numbers (the engine holds a string's contents and a sequence's or map's elements outside the memory \
         that model runs may hold)"
    )]
    NotNumbers { owner: String },
    #[error(
        "the model uses {owner}, whose working memory follows its inputs' values, outside the memory that model \
         runs may hold; a tenant's model may not"
    )]
    UnboundedOperator { owner: String },
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

/// What the walk finds in a model's tensors.
#[derive(Default)]
struct Found {
    references: Vec<FileReference>,
    /// What its sparse tensors take once dense, as an engine makes them at load.
    sparse_dense_bytes: u64,
    /// The first tensor or node that makes strings, sequences or maps.
    not_numbers: Option<String>,
    /// The first node of an operator in [`UNBOUNDED_OPERATORS`].
    unbounded: Option<String>,
}

fn walk(onnx: &[u8]) -> Result<Found, OnnxError> {
    Ok(walk_model(&ModelProto::decode(onnx).map_err(|e| OnnxError::Malformed(e.to_string()))?))
}

fn walk_model(model: &ModelProto) -> Found {
    let mut found = Found::default();
    if let Some(graph) = &model.graph {
        graph.collect(&mut found);
    }
    for function in &model.functions {
        function.nodes.iter().for_each(|node| node.collect(&mut found));
        function.attribute_defaults.iter().for_each(|attribute| attribute.collect(&mut found));
    }
    for training in &model.training_info {
        training.initialization.iter().chain(&training.algorithm).for_each(|graph| graph.collect(&mut found));
    }
    found
}

/// Every file the model names, in the order met.
pub fn file_references(onnx: &[u8]) -> Result<Vec<FileReference>, OnnxError> {
    walk(onnx).map(|found| found.references)
}

/// What a model asks of the engine that loads it, read in one pass before any engine sees it.
pub struct Inspection {
    bytes: u64,
    found: Found,
    expanded: Expanded,
}

/// Read the model (its tensors, graphs and functions; not its weights' data).
pub fn inspect(onnx: &[u8]) -> Result<Inspection, OnnxError> {
    let model = ModelProto::decode(onnx).map_err(|e| OnnxError::Malformed(e.to_string()))?;
    Ok(Inspection { bytes: onnx.len() as u64, found: walk_model(&model), expanded: expand(&model) })
}

impl Inspection {
    /// The bytes an engine holds for the model as it loads: its own, what its sparse tensors
    /// take once dense, and [`NODE_BYTES`] for each node it builds, model-local functions
    /// inlined. A sparse tensor names its dense shape and the few values set: ONNX Runtime makes
    /// it dense at load, so 206 bytes asking for 2^28 floats grew the server by 3 GiB before its
    /// memory was measured (e2e `resources::a_sparse_tensor_counts_at_its_dense_size_before_any_engine_sees_it`).
    /// A function whose body calls another twice, sixteen deep, is 1,256 bytes and 32,768 nodes
    /// once inlined, as ONNX Runtime does at load: 80 s of CPU (`resources::nested_functions_count_as_the_nodes_they_expand_to`).
    pub fn loaded_bytes(&self) -> u64 {
        let nodes = self.expanded.nodes.saturating_mul(NODE_BYTES);
        self.bytes.saturating_add(self.found.sparse_dense_bytes).saturating_add(nodes)
    }

    /// Refuse a model a tenant uploads or a guest loads from bytes that names any file, makes
    /// strings, sequences or maps, uses an operator of [`UNBOUNDED_OPERATORS`], or, once its
    /// local functions are expanded, makes more than [`MAX_TENANT_FUNCTION_CALLS`] calls or holds
    /// more than [`MAX_TENANT_CONSTANTS`] constants. ONNX Runtime keeps a string's contents and a
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
        let Expanded { calls, constants, .. } = self.expanded;
        if calls > MAX_TENANT_FUNCTION_CALLS {
            return Err(OnnxError::TooManyFunctionCalls { calls, limit: MAX_TENANT_FUNCTION_CALLS });
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

/// The nodes of the model's graph and of the graphs its nodes hold, with model-local functions
/// expanded, the calls of those functions made on the way, and the constants (initializers and
/// `Constant` nodes) among them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Expanded {
    nodes: u64,
    calls: u64,
    constants: u64,
}

impl Expanded {
    /// Functions that call each other in a cycle: no end.
    const ENDLESS: Self = Self { nodes: u64::MAX, calls: u64::MAX, constants: u64::MAX };

    fn add(self, other: Self) -> Self {
        Self {
            nodes: self.nodes.saturating_add(other.nodes),
            calls: self.calls.saturating_add(other.calls),
            constants: self.constants.saturating_add(other.constants),
        }
    }
}

fn expand(model: &ModelProto) -> Expanded {
    let functions: HashMap<(&[u8], &[u8]), &FunctionProto> =
        model.functions.iter().map(|f| ((f.domain.as_slice(), f.name.as_slice()), f)).collect();
    let mut expansions = Expansions { functions, counted: HashMap::new() };
    model.graph.as_ref().map_or_else(Expanded::default, |graph| expansions.graph(graph))
}

/// Model-local functions and what each expands to, counted once each.
struct Expansions<'a> {
    functions: HashMap<(&'a [u8], &'a [u8]), &'a FunctionProto>,
    /// `None` while being counted: met again, it calls itself.
    counted: HashMap<(&'a [u8], &'a [u8]), Option<Expanded>>,
}

impl<'a> Expansions<'a> {
    fn graph(&mut self, graph: &'a GraphProto) -> Expanded {
        let initializers = graph.initializers.len().saturating_add(graph.sparse_initializers.len());
        let constants = Expanded { constants: initializers as u64, ..Expanded::default() };
        self.nodes(&graph.nodes).add(constants)
    }

    fn nodes(&mut self, nodes: &'a [NodeProto]) -> Expanded {
        nodes.iter().fold(Expanded::default(), |sum, node| sum.add(self.node(node)))
    }

    fn node(&mut self, node: &'a NodeProto) -> Expanded {
        let key = (node.domain.as_slice(), node.op_type.as_slice());
        let itself = match self.functions.get(&key).copied() {
            None => Expanded { nodes: 1, calls: 0, constants: u64::from(node.op_type == b"Constant") },
            Some(function) => match self.counted.get(&key) {
                Some(Some(counted)) => *counted,
                Some(None) => Expanded::ENDLESS,
                None => {
                    self.counted.insert(key, None);
                    let body = self.nodes(&function.nodes).add(Expanded { calls: 1, ..Expanded::default() });
                    self.counted.insert(key, Some(body));
                    body
                }
            },
        };
        let graphs = node.attributes.iter().flat_map(|attribute| attribute.graph.iter().chain(&attribute.graphs));
        graphs.fold(itself, |sum, graph| sum.add(self.graph(graph)))
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
/// Operators whose working memory, outside ONNX Runtime's capped arena, follows the values of
/// their inputs, not their sizes: `RoiAlign` samples each region on a grid as fine as the region
/// is large (sampling_ratio 0) and precomputes every point of it, so a 196-byte graph given one
/// 8000×8000 region of an 8×8 image grew a process by 2.9 GiB in 2 s (ONNX Runtime 1.32).
const UNBOUNDED_OPERATORS: [&[u8]; 1] = [b"RoiAlign"];
/// The operators that make a sequence or a map out of tensors.
const COLLECTION_MAKERS: [&[u8]; 4] = [b"SequenceConstruct", b"SequenceEmpty", b"SplitToSequence", b"ZipMap"];
/// The operator that runs a precompiled blob, which it may name as a file.
const EP_CONTEXT: &str = "EPContext";

// The subset of `onnx.proto` that can hold tensors and graphs (field numbers from the ONNX IR).
// Text fields are bytes: proto2 does not require UTF-8, and engines accept models without it.

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
    #[prost(message, repeated, tag = "15")]
    sparse_initializers: Vec<SparseTensorProto>,
}

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

impl GraphProto {
    fn collect(&self, found: &mut Found) {
        self.initializers.iter().for_each(|tensor| tensor.collect(found));
        self.sparse_initializers.iter().for_each(|sparse| sparse.collect(found));
        self.nodes.iter().for_each(|node| node.collect(found));
    }
}

impl NodeProto {
    fn collect(&self, found: &mut Found) {
        if self.op_type == EP_CONTEXT.as_bytes() {
            // Its `ep_cache_context` is a file path unless `embed_mode` is 1; no engine Sluice
            // runs needs one, so any such node counts as naming a file.
            let owner = format!("{} ({EP_CONTEXT})", String::from_utf8_lossy(&self.name));
            found.references.push(FileReference { owner, location: String::new() });
        }
        if found.not_numbers.is_none() && self.makes_non_numbers() {
            found.not_numbers = Some(self.describe());
        }
        if found.unbounded.is_none() && UNBOUNDED_OPERATORS.contains(&self.op_type.as_slice()) {
            found.unbounded = Some(self.describe());
        }
        self.attributes.iter().for_each(|attribute| attribute.collect(found));
    }

    /// `node 'name' (OpType)`, for messages.
    fn describe(&self) -> String {
        let (name, op_type) = (String::from_utf8_lossy(&self.name), String::from_utf8_lossy(&self.op_type));
        format!("node '{}' ({})", shorten(&name), shorten(&op_type))
    }

    /// Whether it makes strings, sequences or maps from tensors of numbers: a sequence or map
    /// maker, a cast to strings (or to a type its function's caller picks), a constant or label
    /// given as text or as a tensor of strings. Every other way to one starts from such a node
    /// or from an initializer of strings (`TensorProto::collect`).
    fn makes_non_numbers(&self) -> bool {
        if COLLECTION_MAKERS.contains(&self.op_type.as_slice()) {
            return true;
        }
        let cast_to = |name: &[u8], is_string: &dyn Fn(&AttributeProto) -> bool| {
            self.attributes
                .iter()
                .filter(|attribute| attribute.name == name)
                .any(|attribute| !attribute.ref_attr_name.is_empty() || is_string(attribute))
        };
        let named_as_text = |attribute: &AttributeProto| {
            // `Constant`'s `value_string(s)`; the ML operators' `classlabels_strings`,
            // `cats_strings`, `keys_strings`, `values_strings`, `default_string`.
            attribute.name.ends_with(b"_string") || attribute.name.ends_with(b"_strings")
        };
        let holds_strings = |attribute: &AttributeProto| {
            let sparse_values = attribute.sparse_tensor.iter().chain(&attribute.sparse_tensors).flat_map(|s| &s.values);
            attribute.tensor.iter().chain(&attribute.tensors).chain(sparse_values).any(|t| t.data_type == Some(STRING))
        };
        match self.op_type.as_slice() {
            b"Cast" => cast_to(b"to", &|attribute| attribute.i == Some(STRING.into())),
            b"CastMap" => cast_to(b"cast_to", &|attribute| attribute.s.as_deref() == Some(b"TO_STRING")),
            _ => self.attributes.iter().any(|attribute| named_as_text(attribute) || holds_strings(attribute)),
        }
    }
}

impl AttributeProto {
    fn collect(&self, found: &mut Found) {
        self.tensor.iter().chain(&self.tensors).for_each(|tensor| tensor.collect(found));
        self.sparse_tensor.iter().chain(&self.sparse_tensors).for_each(|sparse| sparse.collect(found));
        self.graph.iter().chain(&self.graphs).for_each(|graph| graph.collect(found));
    }
}

impl SparseTensorProto {
    fn collect(&self, found: &mut Found) {
        self.values.iter().chain(&self.indices).for_each(|tensor| tensor.collect(found));
        found.sparse_dense_bytes = found.sparse_dense_bytes.saturating_add(self.dense_bytes());
    }

    /// Its dense shape's elements times their size (all of memory where a dimension is
    /// negative or the product overflows).
    fn dense_bytes(&self) -> u64 {
        let element = element_bytes(self.values.as_ref().and_then(|values| values.data_type).unwrap_or(0));
        let elements = self.dims.iter().try_fold(1u64, |product, &dim| product.checked_mul(u64::try_from(dim).ok()?));
        elements.and_then(|elements| elements.checked_mul(element)).unwrap_or(u64::MAX)
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

impl TensorProto {
    fn collect(&self, found: &mut Found) {
        if found.not_numbers.is_none() && self.data_type == Some(STRING) {
            found.not_numbers = Some(format!("tensor '{}'", shorten(&String::from_utf8_lossy(&self.name))));
        }
        if self.data_location == Some(EXTERNAL) || !self.external_data.is_empty() {
            let location = self.external_data.iter().find(|e| e.key == b"location");
            found.references.push(FileReference {
                owner: String::from_utf8_lossy(&self.name).into_owned(),
                location: location.map(|e| String::from_utf8_lossy(&e.value).into_owned()).unwrap_or_default(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(loaded_bytes(&onnx), Ok(onnx.len() as u64 + 4000 + 2 * NODE_BYTES), "and two nodes");
        // Shapes that overflow or go negative take all of memory.
        for dims in [vec![1 << 40, 1 << 40], vec![-1, 4]] {
            let graph = GraphProto { sparse_initializers: vec![floats(dims)], ..Default::default() };
            assert_eq!(loaded_bytes(&model(graph)), Ok(u64::MAX));
        }
        let digits = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/digits/model/digits.onnx"))
            .expect("the digits model");
        let nodes = ModelProto::decode(digits.as_slice()).expect("decodes").graph.expect("a graph").nodes.len() as u64;
        assert_eq!(loaded_bytes(&digits), Ok(digits.len() as u64 + nodes * NODE_BYTES), "no sparse tensor");
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
        ];
        for onnx in allowed {
            assert_eq!(check_tenant_model(&onnx), Ok(()));
        }
        let digits = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/digits/model/digits.onnx"))
            .expect("the digits model");
        assert_eq!(check_tenant_model(&digits), Ok(()));
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
        let graph = GraphProto { nodes, initializers: vec![embedded("w"); 96], sparse_initializers: vec![sparse; 96] };
        let mut model = ModelProto { graph: Some(graph), training_info: Vec::new(), functions: vec![function] };
        let too_many = OnnxError::TooManyConstants { count: 16_385, limit: MAX_TENANT_CONSTANTS };
        assert_eq!(check_tenant_model(&model.encode_to_vec()), Err(too_many));
        model.graph.as_mut().map(|graph| graph.sparse_initializers.pop());
        assert_eq!(check_tenant_model(&model.encode_to_vec()), Ok(()));
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
        assert_eq!(owners, ["ctx (EPContext)", "f", "t"]);
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
