//! A real browser for tests: Debian's `chromium`, headless, driven over WebDriver by a private
//! `chromedriver` on a free loopback port.
//!
//! **Role.** The sale page is tested as a buyer meets it (its script, its clock, its pushed
//! changes, its console), not by reading its HTML. A [`Browser`] starts one chromedriver and
//! one session with a fresh profile, and offers what page tests do: go to a URL, read an
//! element's text by id, click, wait for a text, take numbered screenshots into the test's
//! output folder, run a script, and read the console's errors.
//!
//! **Why a small client of our own** rather than the `fantoccini` crate: fantoccini builds
//! without TLS, but brings the `webdriver` crate and with it `icu_segmenter` and its compiled
//! data, `http` 0.2 and a second `cookie`, for the dozen JSON calls below. The calls go over
//! the kit's own HTTP/1 client ([`crate::load::connect`]), a fresh loopback connection each.
//!
//! **Guarantees.** chromedriver listens on loopback only, on a port the kernel picked; the
//! browser resolves no host name but loopback ones (`--host-resolver-rules`), so a page under
//! test can never reach the network, and chromium's own background services cannot either.
//! Dropping the [`Browser`] ends the session, then kills chromedriver's whole process group
//! and the browser's process, so no chromium outlives its test; the profile directory goes
//! with it.
//!
//! **Non-goals.** Other browsers, several windows, frames, file uploads. Every helper panics
//! with what it was doing and what the page showed: it serves tests only.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use serde_json::{json, Value};

/// Where Debian's `chromium` and `chromium-driver` packages put them.
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver answers `/status` within a few hundred ms of its start on this machine.
const DRIVER_READY_MAX: Duration = Duration::from_secs(20);
/// One WebDriver call: a navigation waits for the page's load event, a screenshot renders.
const CALL_MAX: Duration = Duration::from_secs(60);
/// Ending the session on drop: chromium quits in about 100 ms.
const QUIT_MAX: Duration = Duration::from_secs(5);
/// How often a wait reads the page again.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// The key W3C WebDriver names an element reference under.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// The window every test sees, so screenshots compare.
const WINDOW_SIZE: &str = "--window-size=1000,900";

/// One entry of the browser's log: a console call, an uncaught error, a failed load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// `SEVERE`, `WARNING`, `INFO`, `DEBUG`.
    pub level: String,
    /// `console-api` (console.error and friends), `javascript` (uncaught), `network` (a load
    /// that failed or answered 4xx/5xx; a page's own 409 `sold_out` shows here too).
    pub source: String,
    pub message: String,
}

/// A headless chromium under a private chromedriver, with one WebDriver session.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    /// chromium's own pid, killed on drop in case the session did not end it.
    browser_pid: Option<u32>,
    out_dir: PathBuf,
    shots: AtomicU32,
    /// Everything read from the browser log so far: reading it drains chromedriver's buffer.
    log: Mutex<Vec<LogEntry>>,
    /// The profile and chromedriver's log; removed on drop.
    scratch: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless chromium with a fresh profile; screenshots go to
    /// `out_dir` (created if missing). Panics, naming the packages, when they are not
    /// installed.
    pub async fn start(out_dir: &Path) -> Browser {
        for (program, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: install Debian's {package} (scripts/test installs it)"
            );
        }
        std::fs::create_dir_all(out_dir).unwrap_or_else(|e| panic!("creating {}: {e}", out_dir.display()));
        let scratch =
            tempfile::Builder::new().prefix("seckill-browser-").tempdir().expect("a temp dir for the profile");
        let port = free_port();
        let log_path = scratch.path().join("chromedriver.log");
        let mut command = Command::new(CHROMEDRIVER);
        command
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log_path.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group: chromium and its helpers join it, so one signal ends them
        // all even if chromedriver dies first (they would be orphans otherwise).
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let driver = command.spawn().unwrap_or_else(|e| panic!("starting {CHROMEDRIVER}: {e}"));
        let mut browser = Browser {
            driver,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            session: String::new(),
            browser_pid: None,
            out_dir: out_dir.to_path_buf(),
            shots: AtomicU32::new(0),
            log: Mutex::new(Vec::new()),
            scratch,
        };
        browser.await_driver().await;
        browser.open_session().await;
        browser
    }

    async fn await_driver(&mut self) {
        let deadline = Instant::now() + DRIVER_READY_MAX;
        loop {
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!("chromedriver exited at start ({status}); its log:\n{}", self.driver_log());
            }
            if let Ok(value) = self.call(Method::GET, "/status", None).await {
                if value["ready"] == true {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver not ready on {} within {DRIVER_READY_MAX:?}; its log:\n{}",
                self.addr,
                self.driver_log()
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    async fn open_session(&mut self) {
        let profile = self.scratch.path().join("profile");
        let mut args = vec![
            "--headless=new".to_string(),
            "--disable-gpu".to_string(),
            // Containers give /dev/shm 64 MB, which a renderer outgrows.
            "--disable-dev-shm-usage".to_string(),
            WINDOW_SIZE.to_string(),
            format!("--user-data-dir={}", profile.display()),
            "--no-first-run".to_string(),
            // No name resolves but loopback's: a page under test, or chromium's own update and
            // telemetry services, cannot reach beyond this machine.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1".to_string(),
        ];
        if crate::postgres::is_root() {
            // Chromium's sandbox refuses to run as root; the pages are our own.
            args.push("--no-sandbox".to_string());
        }
        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
                    "goog:loggingPrefs": { "browser": "ALL" },
                }
            }
        });
        let answer = self
            .call(Method::POST, "/session", Some(capabilities))
            .await
            .unwrap_or_else(|e| panic!("opening a chromium session: {e}; chromedriver's log:\n{}", self.driver_log()));
        self.session = answer["sessionId"].as_str().expect("a new session names its id").to_string();
        self.browser_pid = answer["capabilities"]["goog:processID"].as_u64().and_then(|pid| u32::try_from(pid).ok());
    }

    /// Where screenshots go.
    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    /// Navigates and waits for the page's load event.
    pub async fn goto(&self, url: &str) {
        self.session_call(Method::POST, "url", Some(json!({ "url": url })))
            .await
            .unwrap_or_else(|e| panic!("going to {url}: {e}"));
    }

    /// The page's current URL.
    pub async fn url(&self) -> String {
        let value =
            self.session_call(Method::GET, "url", None).await.unwrap_or_else(|e| panic!("reading the URL: {e}"));
        value.as_str().unwrap_or_default().to_string()
    }

    /// The rendered text of the element with this id (empty while it is hidden).
    pub async fn text(&self, id: &str) -> String {
        self.try_text(id).await.unwrap_or_else(|e| panic!("reading the text of #{id}: {e}"))
    }

    async fn try_text(&self, id: &str) -> Result<String, String> {
        let element = self.element(id).await?;
        let value = self.session_call(Method::GET, &format!("element/{element}/text"), None).await?;
        Ok(value.as_str().unwrap_or_default().to_string())
    }

    /// Whether the element (a button, an input) is enabled.
    pub async fn is_enabled(&self, id: &str) -> bool {
        let enabled = async {
            let element = self.element(id).await?;
            self.session_call(Method::GET, &format!("element/{element}/enabled"), None).await
        };
        enabled.await.unwrap_or_else(|e| panic!("reading whether #{id} is enabled: {e}")) == true
    }

    /// Clicks the element as a user would: scrolled into view, refused if it is covered.
    pub async fn click(&self, id: &str) {
        let clicked = async {
            let element = self.element(id).await?;
            self.session_call(Method::POST, &format!("element/{element}/click"), Some(json!({}))).await
        };
        clicked.await.unwrap_or_else(|e| panic!("clicking #{id}: {e}"));
    }

    /// Types `keys` into the element (an input).
    pub async fn type_into(&self, id: &str, keys: &str) {
        let typed = async {
            let element = self.element(id).await?;
            self.session_call(Method::POST, &format!("element/{element}/value"), Some(json!({ "text": keys }))).await
        };
        typed.await.unwrap_or_else(|e| panic!("typing into #{id}: {e}"));
    }

    /// Waits until the element's text contains `expected`; returns the text. On timeout, takes
    /// a screenshot and panics with the last text seen.
    pub async fn wait_for_text(&self, id: &str, expected: &str, timeout: Duration) -> String {
        self.wait_for_text_matching(id, &format!("to contain {expected:?}"), |text| text.contains(expected), timeout)
            .await
    }

    /// Waits until `matches` accepts the element's text; `what` says what was awaited, for the
    /// panic on timeout.
    pub async fn wait_for_text_matching(
        &self,
        id: &str,
        what: &str,
        matches: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.try_text(id).await;
            if let Ok(text) = &seen {
                if matches(text) {
                    return text.clone();
                }
            }
            if Instant::now() >= deadline {
                let shot = self.screenshot(&format!("timeout-{id}")).await;
                panic!(
                    "#{id} did not come {what} within {timeout:?}: last {seen:?}; screenshot {}; console {:?}",
                    shot.display(),
                    self.console_errors().await
                );
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Waits until `script` (a function body that returns a value) returns `true`.
    pub async fn wait_until(&self, what: &str, script: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.execute(script).await != true {
            assert!(Instant::now() < deadline, "{what}: not true within {timeout:?}");
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Saves a screenshot of the window as `<out_dir>/<nn>-<name>.png`, numbered in the order
    /// taken, and returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let value = self
            .session_call(Method::GET, "screenshot", None)
            .await
            .unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
        let png = base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("screenshot {name} is not base64: {e}"));
        // Relaxed: a counter for names; the calls of one test are sequential anyway.
        let number = self.shots.fetch_add(1, Ordering::Relaxed) + 1;
        let path = self.out_dir.join(format!("{number:02}-{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Runs `script` as the body of a function in the page (`return …` gives a value back).
    pub async fn execute(&self, script: &str) -> Value {
        self.session_call(Method::POST, "execute/sync", Some(json!({ "script": script, "args": [] })))
            .await
            .unwrap_or_else(|e| panic!("running a script: {e}\n{script}"))
    }

    /// Every `SEVERE` entry of the browser's log since the session began: `console.error`,
    /// uncaught exceptions, and loads that failed or answered 4xx/5xx (`source == "network"`).
    pub async fn console_errors(&self) -> Vec<LogEntry> {
        self.log().await.into_iter().filter(|entry| entry.level == "SEVERE").collect()
    }

    /// Every entry of the browser's log since the session began.
    pub async fn log(&self) -> Vec<LogEntry> {
        let fresh = self
            .session_call(Method::POST, "se/log", Some(json!({ "type": "browser" })))
            .await
            .unwrap_or_else(|e| panic!("reading the browser log: {e}"));
        let mut log = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for entry in fresh.as_array().into_iter().flatten() {
            let field = |name: &str| entry[name].as_str().unwrap_or_default().to_string();
            log.push(LogEntry { level: field("level"), source: field("source"), message: field("message") });
        }
        log.clone()
    }

    /// The element reference for an id, or the driver's error (`no such element`).
    async fn element(&self, id: &str) -> Result<String, String> {
        let selector = format!("[id=\"{}\"]", id.replace('\\', "\\\\").replace('"', "\\\""));
        let value = self
            .session_call(Method::POST, "element", Some(json!({ "using": "css selector", "value": selector })))
            .await?;
        value[ELEMENT_KEY].as_str().map(str::to_string).ok_or_else(|| format!("no element reference in {value}"))
    }

    async fn session_call(&self, method: Method, command: &str, body: Option<Value>) -> Result<Value, String> {
        self.call(method, &format!("/session/{}/{command}", self.session), body).await
    }

    /// One WebDriver command: its `value`, or its error as `"<error>: <message>"`.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let exchange = async {
            let mut sender = crate::load::connect(self.addr).await.map_err(|e| e.to_string())?;
            let bytes = body.map(|body| Bytes::from(body.to_string())).unwrap_or_default();
            let request = Request::builder()
                .method(method.clone())
                .uri(path)
                .header(HOST, self.addr.to_string())
                .header(CONTENT_TYPE, "application/json")
                .body(Full::new(bytes))
                .map_err(|e| e.to_string())?;
            let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            let mut answer: Value = serde_json::from_slice(&body)
                .map_err(|e| format!("{status}: not JSON ({e}): {}", String::from_utf8_lossy(&body)))?;
            let value = answer["value"].take();
            if status.is_success() {
                Ok(value)
            } else {
                Err(format!("{}: {}", value["error"].as_str().unwrap_or("error"), value["message"]))
            }
        };
        tokio::time::timeout(CALL_MAX, exchange)
            .await
            .unwrap_or_else(|_| Err(format!("{method} {path}: no answer within {CALL_MAX:?}")))
    }

    fn driver_log(&self) -> String {
        let log = std::fs::read_to_string(self.scratch.path().join("chromedriver.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Ends the session over a plain blocking connection: drop cannot await.
    fn quit_session(&self) {
        if self.session.is_empty() {
            return;
        }
        let request = format!(
            "DELETE /session/{} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.session, self.addr
        );
        if let Ok(mut stream) = TcpStream::connect_timeout(&self.addr, QUIT_MAX) {
            use std::io::{Read, Write};
            let _ = stream.set_read_timeout(Some(QUIT_MAX));
            let _ = stream.set_write_timeout(Some(QUIT_MAX));
            if stream.write_all(request.as_bytes()).is_ok() {
                // Until the whole answer is in: chromedriver answers once chromium quit, but
                // may keep the connection open despite `Connection: close`.
                let mut answer = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(read @ 1..) = stream.read(&mut chunk) {
                    answer.extend_from_slice(&chunk[..read]);
                    if answer_complete(&answer) {
                        break;
                    }
                }
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.quit_session();
        // The whole group: chromedriver, and any chromium process the session left behind.
        let group = self.driver.id();
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).stderr(Stdio::null()).status();
        if let Some(pid) = self.browser_pid {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Whether `answer` holds an HTTP/1 response's headers and its whole `Content-Length` body.
fn answer_complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|window| window == b"\r\n\r\n") else { return false };
    let headers = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    let length = headers
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    answer.len() >= end + 4 + length
}

/// A loopback port that was free a moment ago, picked by the kernel.
fn free_port() -> u16 {
    crate::redis::free_port().expect("a free loopback port")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::server::conn::http1 as server;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>harness</title>
<link rel="icon" href="/icon.svg"><script src="/page.js" defer></script></head>
<body><p id="greeting">Loading</p>
<button id="go" type="button">Go</button>
<button id="later" type="button" disabled>Later</button>
<button id="fail" type="button">Fail</button></body></html>"#;

    const SCRIPT: &str = r#"
document.getElementById("greeting").textContent = "Ready";
document.getElementById("go").addEventListener("click", () => {
  document.getElementById("greeting").textContent = "Clicked";
  setTimeout(() => { document.getElementById("greeting").textContent = "Clicked, then changed"; }, 300);
});
document.getElementById("fail").addEventListener("click", () => console.error("boom from the page"));
"#;

    const ICON: &str = r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1 1"/>"#;

    /// A server of the three files above on a loopback port the kernel picked.
    async fn serve_page() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = service_fn(|request: Request<hyper::body::Incoming>| async move {
                        let (status, content_type, body) = match request.uri().path() {
                            "/" => (200, "text/html; charset=utf-8", PAGE),
                            "/page.js" => (200, "text/javascript", SCRIPT),
                            "/icon.svg" => (200, "image/svg+xml", ICON),
                            _ => (404, "text/plain", "not found"),
                        };
                        hyper::Response::builder()
                            .status(status)
                            .header(CONTENT_TYPE, content_type)
                            .header("content-security-policy", "default-src 'self'")
                            .body(Full::new(Bytes::from_static(body.as_bytes())))
                    });
                    let _ = server::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        addr
    }

    /// Goal: the harness drives a real chromium: it loads a page from a local server, reads
    /// text, sees a disabled button, clicks, waits for a change the page makes later, writes
    /// numbered PNGs, runs a script, and tells a clean console from one with an error.
    /// Method: a three-file page (HTML, script, icon) under a strict CSP, every step checked.
    #[tokio::test]
    async fn the_harness_drives_headless_chromium_through_a_page() {
        let out = tempfile::Builder::new().prefix("seckill-browser-test-").tempdir().expect("temp dir");
        let addr = serve_page().await;
        let browser = Browser::start(out.path()).await;
        browser.goto(&format!("http://{addr}/")).await;
        assert_eq!(browser.wait_for_text("greeting", "Ready", Duration::from_secs(5)).await, "Ready");
        assert!(browser.is_enabled("go").await);
        assert!(!browser.is_enabled("later").await, "a disabled button reads as disabled");
        let first = browser.screenshot("loaded").await;

        browser.click("go").await;
        assert_eq!(browser.text("greeting").await, "Clicked");
        let later = browser.wait_for_text("greeting", "then changed", Duration::from_secs(5)).await;
        assert_eq!(later, "Clicked, then changed");
        let second = browser.screenshot("clicked").await;
        assert_eq!(first.file_name().and_then(|n| n.to_str()), Some("01-loaded.png"));
        assert_eq!(second.file_name().and_then(|n| n.to_str()), Some("02-clicked.png"));
        for shot in [&first, &second] {
            let png = std::fs::read(shot).expect("the screenshot file");
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1_000, "{} is a PNG", shot.display());
        }

        assert_eq!(browser.execute("return document.title + ' ' + (1 + 2);").await, "harness 3");
        assert_eq!(browser.url().await, format!("http://{addr}/"));
        assert_eq!(browser.console_errors().await, Vec::new(), "a clean page logs no error");

        browser.click("fail").await;
        let errors = browser.console_errors().await;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].source, "console-api");
        assert!(errors[0].message.contains("boom from the page"), "{errors:?}");
        assert_eq!(browser.console_errors().await, errors, "errors read once are still reported");
    }

    /// Goal: no chromium outlives its `Browser`. Method: note the browser's pid, drop the
    /// harness, and look for the pid in /proc.
    #[tokio::test]
    async fn dropping_the_browser_ends_chromium_and_chromedriver() {
        let out = tempfile::Builder::new().prefix("seckill-browser-test-").tempdir().expect("temp dir");
        let browser = Browser::start(out.path()).await;
        let pids = [browser.browser_pid.expect("chromedriver names the browser's pid"), browser.driver.id()];
        let profile = browser.scratch.path().to_path_buf();
        drop(browser);
        for pid in pids {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            // A reaped process is gone; one not yet reaped by init shows as a zombie.
            assert!(status.is_empty() || status.contains("State:\tZ"), "process {pid} still runs:\n{status}");
        }
        assert!(!profile.exists(), "the profile directory is removed");
    }
}
