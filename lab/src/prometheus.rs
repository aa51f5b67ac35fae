//! A real Prometheus (Debian's package) scraping a tracer's `--prometheus`
//! endpoint on loopback, with its own config, data directory and port; killed
//! and removed on drop. Queried through its HTTP API as a user's dashboards
//! and alerts would.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::util::unique;

/// A port nothing listens on now (bound and released: another process could
/// take it in between, which a test would see as a failure to listen).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One HTTP GET on loopback; the body, or the reason it failed.
pub fn get(url: &str) -> Result<String, String> {
    ureq::get(url)
        .timeout(Duration::from_secs(10))
        .call()
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|e| e.to_string())
}

pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (ADDR:PORT) every second as job
    /// `stalltrace`, and waits until it is ready.
    pub fn start(target: &str) -> Self {
        Self::start_with_rules(target, None)
    }

    /// `start`, evaluating the rules of `rules` (a rule file) every second.
    pub fn start_with_rules(target: &str, rules: Option<&std::path::Path>) -> Self {
        let dir = std::env::temp_dir().join(unique("stalltrace-prometheus"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: stalltrace\n    static_configs:\n      - targets: ['{target}']\n{}",
                rules.map_or(String::new(), |r| format!("rule_files:\n  - '{}'\n", r.display()))
            ),
        )
        .unwrap();
        let listen = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start prometheus (`cargo xtask setup` installs it): {e}")
            });
        let prometheus = Self {
            child,
            dir,
            url: format!("http://{listen}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(&format!("{}/-/ready", prometheus.url)).is_err() {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready after 60 s: {}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// The series a query API endpoint (`query`, `query_range`) answers
    /// with for `params`; panics on an error, naming the query.
    fn api(&self, endpoint: &str, params: &[(&str, String)]) -> Vec<Value> {
        let mut request = ureq::get(&format!("{}/api/v1/{endpoint}", self.url));
        for (name, value) in params {
            request = request.query(name, value);
        }
        let body = request
            .timeout(Duration::from_secs(10))
            .call()
            .unwrap_or_else(|e| panic!("{endpoint} {params:?}: {e}"))
            .into_string()
            .unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{endpoint} {params:?}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// An instant query's result: each series' labels and value.
    pub fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        self.api("query", &[("query", promql.to_string())])
            .iter()
            .map(|s| (s["metric"].clone(), number(&s["value"])))
            .collect()
    }

    /// A range query's result, as Grafana draws a panel: each series' labels
    /// and its values from `start` to `end` (Unix seconds), `step_s` apart.
    pub fn query_range(
        &self,
        promql: &str,
        start: f64,
        end: f64,
        step_s: f64,
    ) -> Vec<(Value, Vec<f64>)> {
        let params = [
            ("query", promql.to_string()),
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
            ("step", step_s.to_string()),
        ];
        self.api("query_range", &params)
            .iter()
            .map(|s| {
                let values = s["values"].as_array().into_iter().flatten().map(number);
                (s["metric"].clone(), values.collect())
            })
            .collect()
    }

    /// The value of a query that gives one series.
    pub fn value(&self, promql: &str) -> f64 {
        let result = self.query(promql);
        assert_eq!(result.len(), 1, "query {promql}: {result:?}");
        result[0].1
    }

    /// Waits for a successful scrape that began after `after`.
    pub fn wait_scraped_after(&self, after: SystemTime) {
        let since = after
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let last = self.query("timestamp(up{job=\"stalltrace\"} == 1)");
            if last.first().is_some_and(|(_, t)| *t > since) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no successful scrape within 30 s: {last:?}; targets {}",
                get(&format!("{}/api/v1/targets", self.url)).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// The number of a sample (`[time, "value"]`); NaN where it is not one.
fn number(sample: &Value) -> f64 {
    sample[1]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or(f64::NAN)
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
