//! Hand-built ONNX models for the attacks: small graphs written message by message (the
//! ONNX IR's field numbers), so a test can make exactly the model a hostile tenant would
//! upload — one whose tensor names a file, one whose output is enormous — without a Python
//! toolchain.

use prost::Message;

/// ONNX element types used here (`TensorProto.DataType`).
pub const FLOAT: i32 = 1;
pub const UINT8: i32 = 2;
pub const INT64: i32 = 7;
pub const STRING: i32 = 8;
pub const BOOL: i32 = 9;

#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// Model-local functions.
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<FunctionProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    /// The operator's domain (a model-local function's; empty: ONNX's).
    #[prost(string, tag = "7")]
    pub domain: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int64, tag = "3")]
    pub i: i64,
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// `AttributeType`: INT = 2, STRING = 3, TENSOR = 4.
    #[prost(int32, tag = "20")]
    pub r#type: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// 1 = EXTERNAL.
    #[prost(int32, optional, tag = "14")]
    pub data_location: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeProto {
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeProtoTensor>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeProtoTensor {
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

/// A tensor value's type; `None` dimensions are symbolic (`N`).
pub fn value(name: &str, elem_type: i32, dims: &[Option<i64>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Some(v) => Dimension { dim_value: Some(*v), dim_param: None },
            None => Dimension { dim_value: None, dim_param: Some("N".into()) },
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor { elem_type, shape: Some(TensorShapeProto { dim }) }),
        }),
    }
}

pub fn node(op_type: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: format!("{op_type}_{}", outputs.first().copied().unwrap_or("")),
        op_type: op_type.into(),
        attribute,
        domain: String::new(),
    }
}

/// A tensor whose bytes live in the file `location` (`length` bytes from its start).
pub fn external_tensor(name: &str, elem_type: i32, dims: &[i64], location: &str, length: usize) -> TensorProto {
    let entry = |key: &str, value: String| StringStringEntryProto { key: key.into(), value };
    TensorProto {
        dims: dims.to_vec(),
        data_type: elem_type,
        name: name.into(),
        external_data: vec![entry("location", location.into()), entry("length", length.to_string())],
        data_location: Some(1),
        ..Default::default()
    }
}

/// A model of one graph at opset 17.
pub fn model(graph: GraphProto) -> Vec<u8> {
    model_at(graph, 17)
}

/// A model of one graph at ONNX's `opset`.
pub fn model_at(graph: GraphProto, opset: i64) -> Vec<u8> {
    // Opsets 19 and 20 came with the IR's version 9.
    ModelProto {
        ir_version: if opset > 18 { 9 } else { 8 },
        graph: Some(graph),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: opset }],
        functions: Vec::new(),
    }
    .encode_to_vec()
}

/// The exfiltration model: input `x` (FP32 [1], unused) and output `leak` (UINT8
/// [`length`]): the first `length` bytes of the file at `location`, through an initializer
/// that keeps its data there, as a constant node (`as_constant`) or as an initializer.
pub fn reads_file(location: &str, length: usize, as_constant: bool) -> Vec<u8> {
    let secret = external_tensor("secret", UINT8, &[length as i64], location, length);
    let (nodes, initializer) = if as_constant {
        let attribute = AttributeProto { name: "value".into(), t: Some(secret), r#type: 4, ..Default::default() };
        (vec![node("Constant", &[], &["leak"], vec![attribute])], Vec::new())
    } else {
        (vec![node("Identity", &["secret"], &["leak"], Vec::new())], vec![secret])
    };
    model(GraphProto {
        node: nodes,
        name: "exfiltrate".into(),
        initializer,
        input: vec![value("x", FLOAT, &[Some(1)])],
        output: vec![value("leak", UINT8, &[Some(length as i64)])],
        ..Default::default()
    })
}

/// A tensor with its bytes inline.
pub fn tensor(name: &str, elem_type: i32, dims: &[i64], raw_data: Vec<u8>) -> TensorProto {
    TensorProto { dims: dims.to_vec(), data_type: elem_type, name: name.into(), raw_data, ..Default::default() }
}

fn int_attribute(name: &str, value: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i: value, r#type: 2, ..Default::default() }
}

/// A model whose output size the client picks: input `n` (INT64 [1]) and output `big`, FP32
/// [n] of ones (ConstantOfShape), made anew on every call.
pub fn output_of_requested_size() -> Vec<u8> {
    model(GraphProto {
        node: vec![ones_node("big")],
        name: "huge-output".into(),
        initializer: Vec::new(),
        input: vec![value("n", INT64, &[Some(1)])],
        output: vec![value("big", FLOAT, &[None])],
        ..Default::default()
    })
}

/// `total` (FP32 scalar): the sum of `n` (INT64 [1]) ones the engine makes, a run that needs
/// `4 n` bytes at once whatever the size of its answer.
pub fn sum_of_ones() -> Vec<u8> {
    model(GraphProto {
        node: vec![ones_node("ones"), node("ReduceSum", &["ones"], &["total"], vec![int_attribute("keepdims", 0)])],
        name: "sum-of-ones".into(),
        initializer: Vec::new(),
        input: vec![value("n", INT64, &[Some(1)])],
        output: vec![value("total", FLOAT, &[])],
        ..Default::default()
    })
}

/// [`sum_of_ones`] that holds its ones while it computes as [`slow_compute`] does: inputs `n`
/// and `x`, output `total` (the ones' sum plus the slow sum). The ones are made first and summed
/// last, so they are held for the whole run.
pub fn holds_ones_while_computing(size: i64, steps: usize) -> Vec<u8> {
    let slow =
        ModelProto::decode(slow_compute(size, steps).as_slice()).expect("the slow model").graph.expect("a graph");
    let mut nodes = vec![ones_node("ones")];
    nodes.extend(slow.node);
    nodes.push(node("ReduceSum", &["ones"], &["held"], vec![int_attribute("keepdims", 0)]));
    nodes.push(node("Add", &["sum", "held"], &["total"], Vec::new()));
    model(GraphProto {
        node: nodes,
        name: "holds-ones".into(),
        initializer: slow.initializer,
        input: [vec![value("n", INT64, &[Some(1)])], slow.input].concat(),
        output: vec![value("total", FLOAT, &[])],
        ..Default::default()
    })
}

/// `output` (FP32 [n]) of ones from `n` (INT64 [1]).
fn ones_node(output: &str) -> NodeProto {
    let one = tensor("value", FLOAT, &[1], 1f32.to_le_bytes().to_vec());
    let fill = AttributeProto { name: "value".into(), t: Some(one), r#type: 4, ..Default::default() };
    node("ConstantOfShape", &["n"], &[output], vec![fill])
}

/// A model that computes for a long time on any input: `x` (FP32 [1, 1]) is expanded to a
/// `size`×`size` matrix and multiplied by itself `steps` times; `sum` (FP32 scalar) is the
/// sum of the last product. The work depends on the input, so nothing is folded at load.
pub fn slow_compute(size: i64, steps: usize) -> Vec<u8> {
    let shape = tensor("shape", INT64, &[2], [size, size].iter().flat_map(|v| v.to_le_bytes()).collect());
    let mut nodes = vec![node("Expand", &["x", "shape"], &["m0"], Vec::new())];
    for step in 1..=steps {
        let (previous, next) = (format!("m{}", step - 1), format!("m{step}"));
        nodes.push(node("MatMul", &[&previous, "m0"], &[&next], Vec::new()));
    }
    let last = format!("m{steps}");
    nodes.push(node("ReduceSum", &[&last], &["sum"], vec![int_attribute("keepdims", 0)]));
    model(GraphProto {
        node: nodes,
        name: "slow".into(),
        initializer: vec![shape],
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[])],
        ..Default::default()
    })
}

/// A batchable model whose every row computes for a long time from one value: `x` (FP32
/// [N, 1]) spread to `width` values, multiplied by a `width` x `width` matrix `steps` times;
/// `sum` (FP32 [N, 1]) each row's total. A request's cost is its rows' compute, far more than
/// carrying its few bytes, so callers of it keep a model's queue full.
pub fn slow_rows(width: i64, steps: usize) -> Vec<u8> {
    let spread = tensor("spread", FLOAT, &[1, width], 1f32.to_le_bytes().repeat(width as usize));
    let square = tensor("square", FLOAT, &[width, width], vec![0; (width * width) as usize * 4]);
    let axes = tensor("axes", INT64, &[1], 1i64.to_le_bytes().to_vec());
    let mut nodes = vec![node("MatMul", &["x", "spread"], &["m0"], Vec::new())];
    for step in 1..=steps {
        let (previous, next) = (format!("m{}", step - 1), format!("m{step}"));
        nodes.push(node("MatMul", &[&previous, "square"], &[&next], Vec::new()));
    }
    nodes.push(node("ReduceSum", &[&format!("m{steps}"), "axes"], &["sum"], Vec::new()));
    model(GraphProto {
        node: nodes,
        name: "slow-rows".into(),
        initializer: vec![spread, square, axes],
        input: vec![value("x", FLOAT, &[None, Some(1)])],
        output: vec![value("sum", FLOAT, &[None, Some(1)])],
        ..Default::default()
    })
}

/// `y` = `x` (FP32 [4]) reshaped to the shape `s` (INT64 [2]) asks for: a model that fails
/// in the engine whenever `s` does not hold four elements.
pub fn reshapes_on_request() -> Vec<u8> {
    model(GraphProto {
        node: vec![node("Reshape", &["x", "s"], &["y"], Vec::new())],
        name: "fragile".into(),
        initializer: Vec::new(),
        input: vec![value("x", FLOAT, &[Some(4)]), value("s", INT64, &[Some(2)])],
        output: vec![value("y", FLOAT, &[None, None])],
        ..Default::default()
    })
}

/// `y` = `x` (FP32 [4]), with the same inputs as [`reshapes_on_request`]: a model that
/// always answers.
pub fn passes_through() -> Vec<u8> {
    model(GraphProto {
        node: vec![node("Identity", &["x"], &["y"], Vec::new())],
        name: "backup".into(),
        initializer: Vec::new(),
        input: vec![value("x", FLOAT, &[Some(4)]), value("s", INT64, &[Some(2)])],
        output: vec![value("y", FLOAT, &[Some(4)])],
        ..Default::default()
    })
}

/// `y` = `w[i]` (FP32 [1]) for `i` (INT64 [1]), where `w` is `len` weights all equal to `fill`:
/// a model whose weights stay in memory (every answer reads them), and whose answer says
/// which of several such models served it.
pub fn weights_lookup(fill: f32, len: usize) -> Vec<u8> {
    model(GraphProto {
        node: vec![lookup_node()],
        name: "lookup".into(),
        initializer: vec![lookup_weights(fill, len)],
        input: vec![value("i", INT64, &[Some(1)])],
        output: vec![value("y", FLOAT, &[Some(1)])],
        ..Default::default()
    })
}

/// `y` = `w[i]` (FP32 [N, 1]) for each row of `i` (INT64 [N, 1]), where `w` is `[0, 10, 20, …]`
/// (`len` weights): a batchable model whose run fails on an index past the weights (ONNX
/// Runtime checks Gather's indices), so one request's rows can fail a whole batch.
pub fn rows_lookup(len: usize) -> Vec<u8> {
    let weights = (0..len).flat_map(|index| (index as f32 * 10.0).to_le_bytes()).collect();
    model(GraphProto {
        node: vec![lookup_node()],
        name: "rows-lookup".into(),
        initializer: vec![tensor("w", FLOAT, &[len as i64], weights)],
        input: vec![value("i", INT64, &[None, Some(1)])],
        output: vec![value("y", FLOAT, &[None, Some(1)])],
        ..Default::default()
    })
}

/// `y = x0 + x1 + … ` over `inputs` inputs of FP32 [N, `width`]: a model with as many input
/// columns as its author likes.
pub fn sum_of_inputs(inputs: usize, width: i64) -> Vec<u8> {
    let names: Vec<String> = (0..inputs).map(|i| format!("x{i}")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    model(GraphProto {
        node: vec![node("Sum", &name_refs, &["y"], Vec::new())],
        name: "sum-of-inputs".into(),
        input: names.iter().map(|name| value(name, FLOAT, &[None, Some(width)])).collect(),
        output: vec![value("y", FLOAT, &[None, Some(width)])],
        ..Default::default()
    })
}

/// [`weights_lookup`] that also computes for a long time, as [`slow_compute`] does: inputs
/// `x` (FP32 [1, 1]) and `i`, outputs `sum` and `y`.
pub fn slow_weights_lookup(fill: f32, len: usize, size: i64, steps: usize) -> Vec<u8> {
    let slow =
        ModelProto::decode(slow_compute(size, steps).as_slice()).expect("the slow model").graph.expect("a graph");
    let mut node = slow.node;
    node.push(lookup_node());
    model(GraphProto {
        node,
        name: "slow-lookup".into(),
        initializer: [slow.initializer, vec![lookup_weights(fill, len)]].concat(),
        input: [slow.input, vec![value("i", INT64, &[Some(1)])]].concat(),
        output: [slow.output, vec![value("y", FLOAT, &[Some(1)])]].concat(),
        ..Default::default()
    })
}

fn lookup_node() -> NodeProto {
    node("Gather", &["w", "i"], &["y"], vec![int_attribute("axis", 0)])
}

fn lookup_weights(fill: f32, len: usize) -> TensorProto {
    tensor("w", FLOAT, &[len as i64], fill.to_le_bytes().repeat(len))
}

/// `output` = `input` (FP32 [N, 4]): a model whose tensors have the names given.
pub fn passes_through_named(input: &str, output: &str) -> Vec<u8> {
    model(GraphProto {
        node: vec![node("Identity", &[input], &[output], Vec::new())],
        name: "named".into(),
        initializer: Vec::new(),
        input: vec![value(input, FLOAT, &[None, Some(4)])],
        output: vec![value(output, FLOAT, &[None, Some(4)])],
        ..Default::default()
    })
}

/// A graph whose work depends on nothing the caller sends, so an engine may do it at load:
/// a `size`×`size` matrix of ones (made from a shape initializer, a few bytes) multiplied by
/// itself `steps` times and summed, plus `x` (FP32 [1, 1]) into `sum` (FP32 [1, 1]).
pub fn computes_from_constants(size: i64, steps: usize) -> Vec<u8> {
    let shape = tensor("shape", INT64, &[2], [size, size].iter().flat_map(|v| v.to_le_bytes()).collect());
    let one = tensor("value", FLOAT, &[1], 1f32.to_le_bytes().to_vec());
    let fill = AttributeProto { name: "value".into(), t: Some(one), r#type: 4, ..Default::default() };
    let mut nodes = vec![node("ConstantOfShape", &["shape"], &["m0"], vec![fill])];
    for step in 1..=steps {
        let (previous, next) = (format!("m{}", step - 1), format!("m{step}"));
        nodes.push(node("MatMul", &[&previous, "m0"], &[&next], Vec::new()));
    }
    let last = format!("m{steps}");
    nodes.push(node("ReduceSum", &[&last], &["total"], vec![int_attribute("keepdims", 0)]));
    nodes.push(node("Add", &["total", "x"], &["sum"], Vec::new()));
    model(GraphProto {
        node: nodes,
        name: "computes-from-constants".into(),
        initializer: vec![shape],
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        ..Default::default()
    })
}

#[derive(Clone, PartialEq, Message)]
pub struct SparseTensorProto {
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    #[prost(message, optional, tag = "2")]
    pub indices: Option<TensorProto>,
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

/// A model of a few hundred bytes whose sparse initializer `big` is `len` floats once dense, one
/// of them 1: `sum` (FP32 [1, 1]) is `big`'s sum plus `x` (FP32 [1, 1]).
pub fn sparse_of_dense_len(len: i64) -> Vec<u8> {
    model(GraphProto {
        node: vec![
            node("ReduceSum", &["big"], &["total"], vec![int_attribute("keepdims", 0)]),
            node("Add", &["total", "x"], &["sum"], Vec::new()),
        ],
        name: "sparse".into(),
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        sparse_initializer: vec![SparseTensorProto {
            values: Some(tensor("big", FLOAT, &[1], 1f32.to_le_bytes().to_vec())),
            indices: Some(tensor("big_indices", INT64, &[1], 0i64.to_le_bytes().to_vec())),
            dims: vec![len],
        }],
        ..Default::default()
    })
}

#[derive(Clone, PartialEq, Message)]
pub struct FunctionProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "4")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub output: Vec<String>,
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<NodeProto>,
    #[prost(message, repeated, tag = "9")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "10")]
    pub domain: String,
}

/// A model of about a kilobyte whose graph calls model-local function `f0` on `x` (FP32
/// [1, 1]) into `sum`: `f0` calls `f1` twice in a row, and so on, `f{depth - 1}` is `Add(x, x)`;
/// 2^depth - 1 calls and 2^(depth - 1) nodes once inlined.
pub fn nested_functions(depth: usize) -> Vec<u8> {
    let call = |function: &str, input: &str, output: &str| NodeProto {
        domain: "local".into(),
        ..node(function, &[input], &[output], Vec::new())
    };
    let opsets = vec![
        OperatorSetIdProto { domain: String::new(), version: 17 },
        OperatorSetIdProto { domain: "local".into(), version: 1 },
    ];
    let functions = (0..depth)
        .map(|level| FunctionProto {
            name: format!("f{level}"),
            input: vec!["x".into()],
            output: vec!["y".into()],
            node: match level + 1 == depth {
                true => vec![node("Add", &["x", "x"], &["y"], Vec::new())],
                false => {
                    let next = format!("f{}", level + 1);
                    vec![call(&next, "x", "h"), call(&next, "h", "y")]
                }
            },
            opset_import: opsets.clone(),
            domain: "local".into(),
        })
        .collect();
    let graph = GraphProto {
        node: vec![call("f0", "x", "sum")],
        name: "nested".into(),
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        ..Default::default()
    };
    ModelProto { ir_version: 8, graph: Some(graph), opset_import: opsets, functions }.encode_to_vec()
}

/// A chain of `n` `Add(a, a)` nodes from `x` (FP32 [1, 1]) to `sum`: about 40 bytes a node.
pub fn add_chain(n: usize) -> Vec<u8> {
    let mut nodes = Vec::new();
    for i in 0..n {
        let input = if i == 0 { "x".to_string() } else { format!("a{}", i - 1) };
        let output = if i + 1 == n { "sum".to_string() } else { format!("a{i}") };
        nodes.push(node("Add", &[&input, &input], &[&output], Vec::new()));
    }
    model(GraphProto {
        node: nodes,
        name: "chain".into(),
        initializer: Vec::new(),
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        ..Default::default()
    })
}

/// A string that doubles `doublings` times as the graph runs (`StringConcat` of itself, opset
/// 20) from a one-letter constant: input `x` and output `y` (INT64 [1]), `y` = `x` + 1 (the
/// last string tensor's length). Its 2^doublings bytes are the string's contents, which ONNX
/// Runtime keeps in the process's heap, not in its arena.
pub fn doubling_string(doublings: usize) -> Vec<u8> {
    let letter =
        TensorProto { dims: vec![1], data_type: STRING, string_data: vec![b"a".to_vec()], ..Default::default() };
    let constant = AttributeProto { name: "value".into(), t: Some(letter), r#type: 4, ..Default::default() };
    let mut nodes = vec![node("Constant", &[], &["s0"], vec![constant])];
    for step in 1..=doublings {
        let (previous, next) = (format!("s{}", step - 1), format!("s{step}"));
        nodes.push(node("StringConcat", &[&previous, &previous], &[&next], Vec::new()));
    }
    nodes.push(node("Shape", &[&format!("s{doublings}")], &["length"], Vec::new()));
    nodes.push(node("Add", &["length", "x"], &["y"], Vec::new()));
    model_at(
        GraphProto {
            node: nodes,
            name: "doubling-string".into(),
            input: vec![value("x", INT64, &[Some(1)])],
            output: vec![value("y", INT64, &[Some(1)])],
            ..Default::default()
        },
        20,
    )
}

/// A sequence of `n` empty tensors (`SplitToSequence` of an empty tensor into `n` pieces of
/// none): input `n` (INT64 [1]), output `count` (INT64 scalar, `n`). Each piece is an object in
/// the process's heap and nothing in ONNX Runtime's arena, which counts only the `n` sizes.
pub fn sequence_of_empty_tensors() -> Vec<u8> {
    let zero = |elem_type: i32| {
        let bytes = match elem_type {
            FLOAT => 0f32.to_le_bytes().to_vec(),
            _ => 0i64.to_le_bytes().to_vec(),
        };
        let value = tensor("value", elem_type, &[1], bytes);
        vec![AttributeProto { name: "value".into(), t: Some(value), r#type: 4, ..Default::default() }]
    };
    model(GraphProto {
        node: vec![
            node("ConstantOfShape", &["n"], &["sizes"], zero(INT64)),
            node("ConstantOfShape", &["none"], &["empty"], zero(FLOAT)),
            node("SplitToSequence", &["empty", "sizes"], &["pieces"], Vec::new()),
            node("SequenceLength", &["pieces"], &["count"], Vec::new()),
        ],
        name: "sequence-of-empty-tensors".into(),
        initializer: vec![tensor("none", INT64, &[1], 0i64.to_le_bytes().to_vec())],
        input: vec![value("n", INT64, &[Some(1)])],
        output: vec![value("count", INT64, &[])],
        ..Default::default()
    })
}

/// `RoiAlign` of one region of an 8×8 image to one value, sampled as finely as the region is
/// large (sampling_ratio 0): inputs `image` (FP32 [1, 1, 8, 8]) and `region` (FP32 [1, 4]: x1,
/// y1, x2, y2), output `pooled` (FP32 [1, 1, 1, 1]).
pub fn roi_align() -> Vec<u8> {
    let int = |name: &str, value: i64| AttributeProto { name: name.into(), i: value, r#type: 2, ..Default::default() };
    let attributes = vec![int("output_height", 1), int("output_width", 1), int("sampling_ratio", 0)];
    model(GraphProto {
        node: vec![node("RoiAlign", &["image", "region", "first"], &["pooled"], attributes)],
        name: "roi-align".into(),
        initializer: vec![tensor("first", INT64, &[1], 0i64.to_le_bytes().to_vec())],
        input: vec![
            value("image", FLOAT, &[Some(1), Some(1), Some(8), Some(8)]),
            value("region", FLOAT, &[Some(1), Some(4)]),
        ],
        output: vec![value("pooled", FLOAT, &[Some(1), Some(1), Some(1), Some(1)])],
        ..Default::default()
    })
}

/// `count` one-float initializers that no node uses, beside `sum` = `x` (FP32 [1, 1]) through
/// `Identity`: each is a few bytes of the model and a tensor the engine makes as it loads.
pub fn many_initializers(count: usize) -> Vec<u8> {
    let one = 1f32.to_le_bytes().to_vec();
    model(GraphProto {
        node: vec![node("Identity", &["x"], &["sum"], Vec::new())],
        name: "many-initializers".into(),
        initializer: (0..count).map(|index| tensor(&format!("c{index}"), FLOAT, &[1], one.clone())).collect(),
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        ..Default::default()
    })
}

/// `count` one-float `Constant` nodes that no node uses, beside `sum` = `x` through `Identity`.
pub fn many_constants(count: usize) -> Vec<u8> {
    let one = 1f32.to_le_bytes().to_vec();
    let constant = |index: usize| {
        let value = tensor("value", FLOAT, &[1], one.clone());
        let attribute = AttributeProto { name: "value".into(), t: Some(value), r#type: 4, ..Default::default() };
        node("Constant", &[], &[&format!("c{index}")], vec![attribute])
    };
    let mut nodes: Vec<NodeProto> = (0..count).map(constant).collect();
    nodes.push(node("Identity", &["x"], &["sum"], Vec::new()));
    model(GraphProto {
        node: nodes,
        name: "many-constants".into(),
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        ..Default::default()
    })
}

/// `sum` = `x` (FP32 [1, 1]) through `Identity`, beside `count` graph outputs `o{i}`, each
/// `x` through an `Identity` of its own.
pub fn many_graph_outputs(count: usize) -> Vec<u8> {
    let names: Vec<String> = (0..count).map(|index| format!("o{index}")).collect();
    let mut nodes: Vec<NodeProto> = names.iter().map(|name| node("Identity", &["x"], &[name], Vec::new())).collect();
    nodes.push(node("Identity", &["x"], &["sum"], Vec::new()));
    let mut output = vec![value("sum", FLOAT, &[Some(1), Some(1)])];
    output.extend(names.iter().map(|name| value(name, FLOAT, &[Some(1), Some(1)])));
    model(GraphProto {
        node: nodes,
        name: "many-graph-outputs".into(),
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output,
        ..Default::default()
    })
}

/// `sum` = `x` (FP32 [1, 1]) through an `Identity` that holds `count` attributes it has no use
/// for (the engine refuses it, after reading them all), named and valued or `empty`.
pub fn many_attributes(count: usize, empty: bool) -> Vec<u8> {
    let attribute = |index| if empty { AttributeProto::default() } else { int_attribute(&format!("a{index}"), 0) };
    let attributes = (0..count).map(attribute).collect();
    model(GraphProto {
        node: vec![node("Identity", &["x"], &["sum"], attributes)],
        name: "many-attributes".into(),
        input: vec![value("x", FLOAT, &[Some(1), Some(1)])],
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        ..Default::default()
    })
}

/// `sum` = `x` (FP32 [1, 1]) through `Identity`, beside `count` graph inputs no node reads.
pub fn many_graph_inputs(count: usize) -> Vec<u8> {
    let mut input = vec![value("x", FLOAT, &[Some(1), Some(1)])];
    input.extend((0..count).map(|index| value(&format!("i{index}"), FLOAT, &[Some(1)])));
    model(GraphProto {
        node: vec![node("Identity", &["x"], &["sum"], Vec::new())],
        name: "many-graph-inputs".into(),
        input,
        output: vec![value("sum", FLOAT, &[Some(1), Some(1)])],
        ..Default::default()
    })
}

/// `NonZero` of a tensor of `true` shaped by the input `shape` (INT64 [rank]); output `counts`
/// (INT64 [2]) is the shape of its result: the rank and the number of elements. ONNX
/// Runtime gathers 8 bytes per dimension for each of them as it works.
pub fn nonzero_of_shape(rank: i64) -> Vec<u8> {
    let yes = tensor("value", BOOL, &[1], vec![1]);
    let fill = AttributeProto { name: "value".into(), t: Some(yes), r#type: 4, ..Default::default() };
    model(GraphProto {
        node: vec![
            node("ConstantOfShape", &["shape"], &["all"], vec![fill]),
            node("NonZero", &["all"], &["where"], Vec::new()),
            node("Shape", &["where"], &["counts"], Vec::new()),
        ],
        name: "nonzero".into(),
        initializer: Vec::new(),
        input: vec![value("shape", INT64, &[Some(rank)])],
        output: vec![value("counts", INT64, &[Some(2)])],
        ..Default::default()
    })
}

/// A row of ones shaped by the input `shape` (INT64 [4]: [1, 1, 1, width]), resized to four
/// rows by `Resize` in cubic mode; output `counts` (INT64 [4]) is the shape of the result.
/// ONNX Runtime keeps each one-dimensional interpolation it computes in a hash map of its own
/// as it works, one entry per row and column read.
pub fn bicubic_of_shape() -> Vec<u8> {
    let one = tensor("value", FLOAT, &[1], 1f32.to_le_bytes().to_vec());
    let fill = AttributeProto { name: "value".into(), t: Some(one), r#type: 4, ..Default::default() };
    let cubic = AttributeProto { name: "mode".into(), s: b"cubic".to_vec(), r#type: 3, ..Default::default() };
    let scales = [1f32, 1.0, 4.0, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    model(GraphProto {
        node: vec![
            node("ConstantOfShape", &["shape"], &["row"], vec![fill]),
            node("Resize", &["row", "", "scales"], &["rows"], vec![cubic]),
            node("Shape", &["rows"], &["counts"], Vec::new()),
        ],
        name: "bicubic".into(),
        initializer: vec![tensor("scales", FLOAT, &[4], scales)],
        input: vec![value("shape", INT64, &[Some(4)])],
        output: vec![value("counts", INT64, &[Some(4)])],
        ..Default::default()
    })
}

/// `NonMaxSuppression` of one box scored 1 in as many classes as the input `shape` (INT64 [3]:
/// [1, classes, 1]) asks, keeping one box a class; output `counts` (INT64 [2]) is the shape of
/// the result. ONNX Runtime lists every box it keeps, 24 bytes each, before it makes its output.
pub fn suppression_of_shape() -> Vec<u8> {
    let one = tensor("value", FLOAT, &[1], 1f32.to_le_bytes().to_vec());
    let fill = AttributeProto { name: "value".into(), t: Some(one), r#type: 4, ..Default::default() };
    let corners = [0f32, 0.0, 1.0, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    model(GraphProto {
        node: vec![
            node("ConstantOfShape", &["shape"], &["scores"], vec![fill]),
            node("NonMaxSuppression", &["box", "scores", "per_class"], &["kept"], Vec::new()),
            node("Shape", &["kept"], &["counts"], Vec::new()),
        ],
        name: "suppression".into(),
        initializer: vec![
            tensor("box", FLOAT, &[1, 1, 4], corners),
            tensor("per_class", INT64, &[1], 1i64.to_le_bytes().to_vec()),
        ],
        input: vec![value("shape", INT64, &[Some(3)])],
        output: vec![value("counts", INT64, &[Some(2)])],
        ..Default::default()
    })
}

/// ONNX Runtime's own operator `op_type` (its `com.microsoft` domain) of a matrix of ones of the
/// input `shape` (INT64 [2]); output `steps` (INT64) is the shape of what it makes. For
/// `DynamicTimeWarping` (a path through the matrix), which keeps its cost and trace matrices in
/// the heap, two vectors a row: ~180 bytes a row of one column.
pub fn contrib_of_shape(op_type: &str) -> Vec<u8> {
    let one = tensor("value", FLOAT, &[1], 1f32.to_le_bytes().to_vec());
    let fill = AttributeProto { name: "value".into(), t: Some(one), r#type: 4, ..Default::default() };
    let contrib = NodeProto { domain: "com.microsoft".into(), ..node(op_type, &["ones"], &["made"], Vec::new()) };
    let graph = GraphProto {
        node: vec![
            node("ConstantOfShape", &["shape"], &["ones"], vec![fill]),
            contrib,
            node("Shape", &["made"], &["steps"], Vec::new()),
        ],
        name: "contrib".into(),
        input: vec![value("shape", INT64, &[Some(2)])],
        output: vec![value("steps", INT64, &[None])],
        ..Default::default()
    };
    let opsets =
        [("", 17), ("com.microsoft", 1)].map(|(domain, version)| OperatorSetIdProto { domain: domain.into(), version });
    ModelProto { ir_version: 8, graph: Some(graph), opset_import: opsets.to_vec(), functions: Vec::new() }
        .encode_to_vec()
}

/// `AffineGrid` of the identity transform to the input `size` (INT64 [5]: a 3-D grid, [N, C,
/// D, H, W]); output `extent` (INT64 [5]) is the shape of the grid. ONNX Runtime builds the
/// grid in the heap first, about four times its output.
pub fn affine_grid_of_size() -> Vec<u8> {
    let identity = [1f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
    model_at(
        GraphProto {
            node: vec![
                node("AffineGrid", &["theta", "size"], &["grid"], Vec::new()),
                node("Shape", &["grid"], &["extent"], Vec::new()),
            ],
            name: "affine-grid".into(),
            initializer: vec![tensor(
                "theta",
                FLOAT,
                &[1, 3, 4],
                identity.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )],
            input: vec![value("size", INT64, &[Some(5)])],
            output: vec![value("extent", INT64, &[Some(5)])],
            ..Default::default()
        },
        20,
    )
}

/// `total` (INT64 [1]): the sum of `Range(0, n)` for the scalar input `n` (INT64), a run that
/// needs `8 n` bytes at once whatever the size of its answer.
pub fn sum_of_range() -> Vec<u8> {
    let scalar = |name: &str, value: i64| tensor(name, INT64, &[], value.to_le_bytes().to_vec());
    model(GraphProto {
        node: vec![
            node("Range", &["zero", "n", "step"], &["counted"], Vec::new()),
            node("ReduceSum", &["counted"], &["total"], Vec::new()),
        ],
        name: "sum-of-range".into(),
        initializer: vec![scalar("zero", 0), scalar("step", 1)],
        input: vec![value("n", INT64, &[])],
        output: vec![value("total", INT64, &[Some(1)])],
        ..Default::default()
    })
}
