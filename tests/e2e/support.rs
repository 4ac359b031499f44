//! Test support: start the real `sluice serve` binary on port 0 with a temporary tenants
//! directory, talk to it over HTTP, and stop it when the test ends.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

pub const ONNXRUNTIME_VERSION: &str = "1.32.0";

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("SLUICE_REPO_ROOT"))
}

/// A guest component built by the host's build script.
pub fn guest(name: &str) -> PathBuf {
    Path::new(env!("SLUICE_GUEST_DIR")).join(format!("{name}.wasm"))
}

pub fn sha256_file(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    hex::encode(Sha256::digest(&bytes))
}

pub fn sha256_text(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn run(command: &mut Command) {
    let status = command.status().unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(status.success(), "{command:?} failed; the tests need python3 with venv and pip, and PyPI");
}

/// The project's `.venv` (created on first use); one creation at a time across tests.
fn venv_python() -> PathBuf {
    static CREATED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = CREATED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let venv = repo_root().join(".venv");
    let python = venv.join("bin/python3");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    }
    python
}

/// Taken for reading by tests that load every CPU for seconds (building and compiling a
/// Python component) and for writing by tests that time the server's fairness between
/// tenants, so that the one does not skew what the other measures on a 2-CPU machine.
pub static CPU_HEAVY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The `.venv` python with these pip requirements installed (pip is quick when they are).
pub fn python_with(requirements: &[&str]) -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let python = venv_python();
    let _guard = INSTALL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(requirements));
    python
}

/// A program of Debian's `prometheus` package (`prometheus` or `promtool`): from PATH when
/// installed, else unpacked on first use from the package.
pub fn prometheus_program(name: &str) -> PathBuf {
    let on_path = Command::new("sh").args(["-c", &format!("command -v {name}")]).output();
    if let Some(output) = on_path.ok().filter(|o| o.status.success()) {
        let found = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let sibling = if name == "promtool" { "prometheus" } else { "promtool" };
        if Path::new(&found).with_file_name(sibling).exists() {
            return PathBuf::from(found);
        }
    }
    let program = debian_package("prometheus").join("usr/bin").join(name);
    assert!(program.exists(), "{} is not in the prometheus package", program.display());
    program
}

/// Debian's package `name` unpacked (`apt-get download`, `dpkg-deb -x`: no system install,
/// no dependencies) into `target/tools/NAME` on first use; the folder it was unpacked into.
pub fn debian_package(name: &str) -> PathBuf {
    static UNPACKED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = UNPACKED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let root = repo_root().join("target/tools").join(name);
    let done = root.join(".unpacked");
    if done.exists() {
        return root;
    }
    std::fs::create_dir_all(repo_root().join("target")).expect("target");
    let download = tempfile::tempdir_in(repo_root().join("target")).expect("a download directory");
    let fetch = || Command::new("apt-get").args(["download", name]).current_dir(download.path()).status();
    if !fetch().is_ok_and(|s| s.success()) {
        // Package lists may be missing on a fresh machine.
        let _ = Command::new("apt-get").arg("update").status();
        let fetched = fetch();
        assert!(
            fetched.is_ok_and(|s| s.success()),
            "the tests need Debian's {name} package: `apt-get download {name}` failed"
        );
    }
    let package = std::fs::read_dir(download.path())
        .expect("the download")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("the {name} .deb"));
    std::fs::create_dir_all(&root).expect("target/tools");
    let unpack = Command::new("dpkg-deb").arg("-x").arg(&package).arg(&root).status();
    assert!(unpack.is_ok_and(|s| s.success()), "dpkg-deb -x {} failed", package.display());
    std::fs::write(&done, "").expect("marking the package unpacked");
    root
}

/// Pinned version of ONNX Runtime's WebGPU plugin execution provider (PyPI).
pub const WEBGPU_EP_VERSION: &str = "0.4.0";

/// A software WebGPU adapter for the server: ONNX Runtime's WebGPU plugin provider (from
/// PyPI, into the `.venv`) on SwiftShader, the software Vulkan driver Dawn supports, with its
/// Vulkan loader, from Debian's chromium-common package (Mesa's lavapipe 22.3 lacks a feature Dawn
/// needs: BENCHMARKS.md). The server's flags and environment.
pub fn software_webgpu() -> (Vec<String>, Vec<(String, String)>) {
    let python = python_with(&[&format!("onnxruntime-ep-webgpu=={WEBGPU_EP_VERSION}")]);
    let output = Command::new(&python)
        .args(["-c", "import onnxruntime_ep_webgpu as w; print(w.get_library_path())"])
        .output()
        .expect("asking the venv's python for the WebGPU provider");
    let plugin = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert!(Path::new(&plugin).is_file(), "no WebGPU provider library after installing it: {plugin:?}");
    let chromium = debian_package("chromium-common").join("usr/lib/chromium");
    let icd = chromium.join("vk_swiftshader_icd.json");
    assert!(icd.is_file(), "{} is not in the chromium-common package", icd.display());
    let runtime_dir = repo_root().join("target/tools/xdg-runtime");
    std::fs::create_dir_all(&runtime_dir).expect("a runtime directory");
    let env = [
        ("LD_LIBRARY_PATH", chromium.display().to_string()),
        ("VK_ICD_FILENAMES", icd.display().to_string()),
        ("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1".to_string()),
        ("XDG_RUNTIME_DIR", runtime_dir.display().to_string()),
    ];
    (vec!["--webgpu-ep-lib".to_string(), plugin], env.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Where the build puts ONNX Runtime's library (`scripts/fetch_onnxruntime.py`).
pub fn built_onnxruntime_library() -> PathBuf {
    repo_root().join(format!("target/onnxruntime/libonnxruntime.so.{ONNXRUNTIME_VERSION}"))
}

/// The ONNX Runtime library from the pinned `onnxruntime` wheel: the one the build fetched,
/// else the wheel installed into the project's `.venv` on first use.
pub fn onnxruntime_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        if built_onnxruntime_library().is_file() {
            return built_onnxruntime_library();
        }
        let venv = repo_root().join(".venv");
        let python = venv_python();
        let capi = venv.join("lib").read_dir().ok().into_iter().flatten().flatten().find_map(|entry| {
            let capi = entry.path().join("site-packages/onnxruntime/capi");
            capi.join(format!("libonnxruntime.so.{ONNXRUNTIME_VERSION}")).exists().then_some(capi)
        });
        let capi = match capi {
            Some(capi) => capi,
            None => {
                python_with(&[&format!("onnxruntime=={ONNXRUNTIME_VERSION}")]);
                let output = Command::new(&python)
                    .args(["-c", "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))"])
                    .output()
                    .expect("asking the venv's python for onnxruntime");
                PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("capi")
            }
        };
        let library = capi.join(format!("libonnxruntime.so.{ONNXRUNTIME_VERSION}"));
        assert!(library.exists(), "{} is missing after installing onnxruntime", library.display());
        library
    })
}

/// A temporary tenants directory.
pub struct Tenants {
    pub dir: tempfile::TempDir,
}

impl Tenants {
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("temporary tenants directory") }
    }

    pub fn write(&self, file: &str, toml: &str) -> &Self {
        std::fs::write(self.dir.path().join(file), toml).expect("writing a manifest");
        self
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A model entry for a manifest.
pub fn model_entry(name: &str, path: &Path, backend: Option<&str>) -> String {
    let backend = backend.map(|b| format!("backend = \"{b}\"\n")).unwrap_or_default();
    format!("[models.{name}]\npath = \"{}\"\nsha256 = \"{}\"\n{backend}\n", path.display(), sha256_file(path))
}

/// An app entry with one version "1".
pub fn app_entry(name: &str, component: &Path) -> String {
    format!("[apps.{name}]\nstable = \"1\"\nversions.\"1\".component = \"{}\"\n\n", component.display())
}

/// A tenant manifest header: id, one API key, quotas (TOML lines).
pub fn tenant_header(id: &str, key: &str, quotas: &str) -> String {
    format!("version = 1\nid = \"{id}\"\napi_key_sha256 = [\"{}\"]\n\n[quotas]\n{quotas}\n\n", sha256_text(key))
}

pub fn digits_model() -> PathBuf {
    repo_root().join("examples/digits/model/digits.onnx")
}

pub fn digits_small_model() -> PathBuf {
    repo_root().join("examples/digits/model/digits_small.onnx")
}

pub fn magika_model() -> PathBuf {
    repo_root().join("examples/magika/model/model.onnx")
}

/// The server under test: this build's, or `SLUICE_TEST_BIN` (to show which tests an
/// older build fails).
pub fn server_binary() -> PathBuf {
    std::env::var_os("SLUICE_TEST_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sluice")), PathBuf::from)
}

/// A running `sluice serve`, stopped on drop.
pub struct Server {
    child: Child,
    pub base: String,
    /// The gRPC address (`host:port`).
    pub grpc: String,
    /// The metrics base URL, unless started with `--no-metrics`.
    pub metrics: Option<String>,
    log: PathBuf,
    /// The data directory the server made for itself, if it did.
    data: Option<tempfile::TempDir>,
    client: reqwest::Client,
}

impl Server {
    /// Start on port 0 with ONNX Runtime available; panics with the server's log on failure.
    pub fn start(tenants: &Path, extra: &[&str]) -> Self {
        Self::start_with_env(tenants, extra, &[])
    }

    /// [`Server::start`] with extra environment variables for the server process.
    pub fn start_with_env(tenants: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let data = tempfile::tempdir().expect("temporary data directory");
        let mut server = Self::launch(tenants, data.path(), extra, env, None, true)
            .unwrap_or_else(|log| panic!("sluice serve did not start:\n{log}"));
        server.data = Some(data);
        server
    }

    /// Start with a data directory the caller keeps; `Err` carries the log of a server
    /// that exited instead of serving.
    pub fn start_in(tenants: &Path, data: &Path, extra: &[&str]) -> Result<Self, String> {
        Self::launch(tenants, data, extra, &[], None, true)
    }

    /// [`Server::start_in`] with the server's working directory at `cwd` (where a relative
    /// data directory, the default `data`, would be); the server's log goes there too.
    pub fn start_in_dir(tenants: &Path, data: &Path, cwd: &Path, extra: &[&str]) -> Result<Self, String> {
        Self::launch(tenants, data, extra, &[], Some(cwd), true)
    }

    /// [`Server::start_in`] as a user starts it: no ONNX Runtime library named (neither the
    /// flag nor `ORT_DYLIB_PATH`), so the server finds one itself.
    pub fn start_as_users_do(tenants: &Path, data: &Path) -> Result<Self, String> {
        Self::launch(tenants, data, &[], &[], None, false)
    }

    fn launch(
        tenants: &Path,
        data: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        cwd: Option<&Path>,
        name_onnxruntime: bool,
    ) -> Result<Self, String> {
        // Beside the working directory when one is given, so a test can fill the data directory.
        let log = cwd.unwrap_or(data).join(format!(
            "server-{}.log",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        ));
        let log_file = std::fs::File::create(&log).expect("creating the server log");
        let mut command = Command::new(server_binary());
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let mut child = command
            .arg("serve")
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--tenants"])
            .arg(tenants)
            .arg("--data-dir")
            .arg(data)
            .args(if extra.contains(&"--onnxruntime-lib") || !name_onnxruntime {
                Vec::new()
            } else {
                vec!["--onnxruntime-lib".as_ref(), onnxruntime_library().as_os_str()]
            })
            .args(extra)
            .env_remove("ORT_DYLIB_PATH")
            .env("SLUICE_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .expect("spawning sluice");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut http, mut metrics) = (None, None);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(address) = line.strip_prefix("listening on ") {
                    http = Some(address.to_string());
                } else if let Some(address) = line.strip_prefix("metrics listening on ") {
                    metrics = Some(address.to_string());
                } else if let (Some(address), Some(http)) = (line.strip_prefix("grpc listening on "), http.take()) {
                    let _ = sender.send((http, address.to_string(), metrics.take()));
                }
            }
        });
        let started = Instant::now();
        let (base, grpc, metrics) = loop {
            if let Ok(addresses) = receiver.recv_timeout(Duration::from_millis(50)) {
                break addresses;
            }
            if let Ok(Some(_)) = child.try_wait() {
                return Err(std::fs::read_to_string(&log).unwrap_or_default());
            }
            if started.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                return Err(format!("timed out\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
            }
        };
        Ok(Self { child, base, grpc, metrics, log, data: None, client: reqwest::Client::new() })
    }

    /// Ask the server to stop (SIGTERM) and wait (up to 30 s) for it to exit; whether it
    /// exited cleanly.
    pub fn terminate(&mut self) -> bool {
        self.send_sigterm();
        self.wait_exit(Duration::from_secs(30)).is_some_and(|status| status.success())
    }

    /// Send SIGTERM without waiting.
    pub fn send_sigterm(&self) {
        let signalled = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        assert!(signalled.is_ok_and(|status| status.success()), "kill -TERM {}", self.child.id());
    }

    /// The server's exit status, once it exits within `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's resident memory now, in bytes (Linux `/proc`).
    pub fn rss_bytes(&self) -> u64 {
        rss_of(self.child.id())
    }

    /// The server's largest resident memory while `work` runs, sampled every 5 ms, less
    /// what it held before: how much `work` made it allocate at its peak.
    pub async fn peak_growth<T>(&self, work: impl Future<Output = T>) -> (T, u64) {
        let before = self.rss_bytes();
        let pid = self.child.id();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut peak = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    peak = peak.max(rss_of(pid));
                    std::thread::sleep(Duration::from_millis(5));
                }
                peak.max(rss_of(pid))
            }
        });
        let result = work.await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let peak = watcher.join().expect("the memory watcher");
        (result, peak.saturating_sub(before))
    }

    /// CPU time the server has used so far (user + system, from `/proc`).
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).expect("/proc stat");
        // Fields after the command name (which is in parentheses): utime is the 14th field.
        let fields: Vec<&str> = stat.rsplit_once(')').expect("stat").1.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        Duration::from_millis(ticks * 10)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET with an optional key; the status and the JSON body (Null when empty).
    pub async fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        read(request.send().await.expect("GET reaches the server")).await
    }

    /// POST a JSON infer request to a model.
    /// The sum of the metric samples whose line starts with `prefix` (0 when there are none).
    pub async fn metric(&self, prefix: &str) -> f64 {
        let base = self.metrics.clone().expect("metrics");
        let text = reqwest::get(format!("{base}/metrics")).await.expect("scrape").text().await.expect("text");
        text.lines()
            .filter(|line| line.starts_with(prefix))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub async fn infer(&self, model: &str, key: &str, body: &Value) -> (u16, Value) {
        self.post_raw(&format!("/v2/models/{model}/infer"), Some(key), serde_json::to_vec(body).expect("json")).await
    }

    /// An infer request with extra HTTP headers.
    pub async fn infer_with_headers(
        &self,
        model: &str,
        key: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut request =
            self.client.post(format!("{}/v2/models/{model}/infer", self.base)).bearer_auth(key).json(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        read(request.send().await.expect("POST reaches the server")).await
    }

    /// An infer request in the binary tensor extension: the JSON header, then `binary`.
    pub async fn infer_binary(&self, model: &str, key: &str, header: &Value, binary: &[u8]) -> (u16, Value) {
        let json = serde_json::to_vec(header).expect("json");
        let request = self
            .client
            .post(format!("{}/v2/models/{model}/infer", self.base))
            .bearer_auth(key)
            .header("Inference-Header-Content-Length", json.len())
            .body([json.as_slice(), binary].concat());
        read(request.send().await.expect("POST reaches the server")).await
    }

    /// The TCP ports the server process listens on (from /proc: its socket inodes in the
    /// kernel's listening-socket tables).
    pub fn listening_ports(&self) -> std::collections::BTreeSet<u16> {
        let pid = self.child.id();
        let inodes: std::collections::BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("the server's descriptors")
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_string_lossy().into_owned();
                Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .collect();
        let mut ports = std::collections::BTreeSet::new();
        for table in ["tcp", "tcp6"] {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            for line in text.lines().skip(1) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // local_address is field 1 (ADDR:PORT in hex), st field 3 (0A: LISTEN), inode field 9.
                if fields.len() > 9 && fields[3] == "0A" && inodes.contains(fields[9]) {
                    let port = fields[1].rsplit(':').next().and_then(|hex| u16::from_str_radix(hex, 16).ok());
                    ports.extend(port);
                }
            }
        }
        ports
    }

    /// Any method with a raw body; the status and the JSON answer.
    pub async fn send(&self, method: reqwest::Method, path: &str, key: &str, body: Vec<u8>) -> (u16, Value) {
        let request = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(key).body(body);
        read(request.send().await.expect("request reaches the server")).await
    }

    /// The data directory of a server started without one given.
    pub fn data_dir(&self) -> Option<&Path> {
        self.data.as_ref().map(tempfile::TempDir::path)
    }

    /// The `host:port` the HTTP API listens on.
    pub fn http_address(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    pub async fn post_raw(&self, path: &str, key: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let mut request = self.client.post(format!("{}{path}", self.base)).body(body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        read(request.send().await.expect("POST reaches the server")).await
    }
}

/// Resident memory of process `pid`, in bytes (0 once it has gone).
fn rss_of(pid: u32) -> u64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return 0 };
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).unwrap_or(0) * 1024
}

async fn read(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("response body");
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
    (status, body)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One UINT8 image input for the digits components.
pub fn image_request(pixels: &[u8], shape: &[usize]) -> Value {
    serde_json::json!({ "inputs": [{ "name": "image", "shape": shape, "datatype": "UINT8", "data": pixels }] })
}

/// The error message of an error response.
pub fn error_message(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_else(|| panic!("expected an error body, got {body}"))
}

/// The held-out digits: (64 pixels, label) pairs.
pub fn heldout_digits() -> Vec<(Vec<u8>, i64)> {
    let path = repo_root().join("examples/digits/testdata/heldout.json");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("held-out digits")).expect("json");
    let images = data["images"].as_array().expect("images");
    let labels = data["labels"].as_array().expect("labels");
    images
        .iter()
        .zip(labels)
        .map(|(image, label)| {
            let pixels = image.as_array().expect("pixels").iter().map(|p| p.as_u64().expect("pixel") as u8).collect();
            (pixels, label.as_i64().expect("label"))
        })
        .collect()
}

pub fn f32s(value: &Value) -> Vec<f32> {
    value.as_array().expect("array").iter().map(|v| v.as_f64().expect("number") as f32).collect()
}

pub fn i64s(value: &Value) -> Vec<i64> {
    value.as_array().expect("array").iter().map(|v| v.as_i64().expect("integer")).collect()
}

/// The output named `name` of an infer response.
pub fn output<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["outputs"]
        .as_array()
        .and_then(|outputs| outputs.iter().find(|o| o["name"] == name))
        .unwrap_or_else(|| panic!("no output '{name}' in {body}"))
}

/// A gRPC request carrying the tenant's key.
pub fn authed<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().expect("ascii"));
    request
}

/// A gRPC call of the hostile test guest (app `hostile`) in one of its modes.
pub fn hostile_grpc_request(mode: &str) -> sluice::api::grpc::proto::ModelInferRequest {
    use sluice::api::grpc::proto::{InferParameter, ModelInferRequest, infer_parameter};
    let mode = InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::StringParam(mode.into())) };
    ModelInferRequest {
        model_name: "hostile".into(),
        parameters: [("mode".to_string(), mode)].into(),
        ..Default::default()
    }
}

/// A gRPC call of `digits-mlp` on one row of 64 FP32 values, as typed contents.
pub fn digits_grpc_request(x: Vec<f32>) -> sluice::api::grpc::proto::ModelInferRequest {
    use sluice::api::grpc::proto::model_infer_request::InferInputTensor;
    use sluice::api::grpc::proto::{InferTensorContents, ModelInferRequest};
    ModelInferRequest {
        model_name: "digits-mlp".into(),
        inputs: vec![InferInputTensor {
            name: "X".into(),
            datatype: "FP32".into(),
            shape: vec![1, 64],
            parameters: Default::default(),
            contents: Some(InferTensorContents { fp32_contents: x, ..Default::default() }),
        }],
        ..Default::default()
    }
}

/// `component` with a custom section named `name` at its end: another component to the
/// server (its own digest, compiled apart), the same code.
pub fn with_custom_section(component: &[u8], name: &str) -> Vec<u8> {
    use wasm_encoder::ComponentSection;
    let mut out = component.to_vec();
    wasm_encoder::CustomSection { name: name.into(), data: (&[][..]).into() }.append_to_component(&mut out);
    out
}

/// `component` with every core memory it defines or imports at least `mib` MiB at its
/// start: the same code, asking for as much memory as a component with that much static
/// data (an interpreter's heap image, say) does.
pub fn with_memory_of(component: &[u8], mib: u64) -> Vec<u8> {
    use wasm_encoder::reencode::{Error, Reencode, ReencodeComponent};
    struct AtLeast {
        pages: u64,
    }
    impl Reencode for AtLeast {
        type Error = std::convert::Infallible;
        fn memory_type(
            &mut self,
            memory: wasmparser::MemoryType,
        ) -> Result<wasm_encoder::MemoryType, Error<Self::Error>> {
            Ok(wasm_encoder::MemoryType {
                minimum: memory.initial.max(self.pages),
                maximum: memory.maximum.map(|maximum| maximum.max(self.pages)),
                memory64: memory.memory64,
                shared: memory.shared,
                page_size_log2: memory.page_size_log2,
            })
        }
    }
    impl ReencodeComponent for AtLeast {}
    let mut out = wasm_encoder::Component::new();
    let mut larger = AtLeast { pages: (mib << 20) >> 16 };
    larger.parse_component(&mut out, wasmparser::Parser::new(0), component).expect("a component wasm-encoder reads");
    out.finish()
}

/// The hostile guest's request to load `graph` from its bytes (wasi:nn `load`).
pub fn load_bytes_request(graph: &[u8]) -> Value {
    serde_json::json!({
        "inputs": [{ "name": "graph", "shape": [graph.len()], "datatype": "UINT8", "data": graph }],
        "parameters": { "mode": "load-bytes" },
    })
}
