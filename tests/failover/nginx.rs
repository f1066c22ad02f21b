//! Real nginx in front of a fleet, configured by `seckill lb-config nginx`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fleet::Fleet;

pub struct Nginx {
    pub addr: SocketAddr,
    child: Child,
}

/// The nginx binary: on PATH, or where Debian puts it (`/usr/sbin` is not on every PATH).
fn binary() -> PathBuf {
    let on_path = Command::new("sh").args(["-c", "command -v nginx"]).output().ok().filter(|o| o.status.success());
    on_path
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"))
}

impl Nginx {
    /// Generates the config with the CLI, checks it with `nginx -t`, and runs nginx in the
    /// foreground under the fleet's directory.
    pub async fn start(fleet: &Fleet) -> Nginx {
        let port = testkit::redis::free_port().expect("free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let prefix = fleet.dir().join("nginx");
        std::fs::create_dir_all(prefix.join("tmp")).expect("nginx dir");
        let generated = Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args(["lb-config", "nginx", "--listen", &addr.to_string(), "--config"])
            .arg(fleet.config_path())
            .output()
            .expect("seckill lb-config");
        assert!(generated.status.success(), "lb-config failed: {}", String::from_utf8_lossy(&generated.stderr));
        let conf = prefix.join("nginx.conf");
        std::fs::write(&conf, &generated.stdout).expect("write nginx.conf");
        let check =
            Command::new(binary()).arg("-t").arg("-p").arg(&prefix).arg("-c").arg(&conf).output().expect("nginx -t");
        assert!(
            check.status.success(),
            "nginx -t refused the generated config: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new(binary())
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nginx (scripts/test installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {addr}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Nginx { addr, child }
    }
}

impl Drop for Nginx {
    /// SIGTERM, nginx's fast shutdown: the master stops its workers. SIGKILL on the master would
    /// orphan them, still listening.
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
