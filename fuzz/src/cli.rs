//! The `cli` target: `lull run` argument vectors (real flags with arbitrary values, and
//! arbitrary words), JSON `--config` documents, memory sizes and serial modes.
//!
//! Checks: nothing panics; a configuration `to_config` accepts passes `validate` and keeps its
//! rules (whole pages of memory, a quota that can apply, no user-irqchip timer model with the
//! kernel irqchip); only a JSON object parses as a config, and one that parses survives a
//! serialize/parse round trip; sizes and serial modes that parse print
//! back to something that parses to the same value. `--config` itself is never passed (it would
//! read files); its parser is fuzzed through the JSON input instead.

use arbitrary::{Arbitrary, Unstructured};
use clap::Parser;
use timer::ModelKind;
use vmm::config::{IrqchipMode, SerialMode, VmArgs, VmConfig};
use vmm::size::ByteSize;

/// `lull run` as the `lull` binary parses it, with the VM's flags only (`lull bench` left out,
/// so that the target does not link the bench crate; `-v` is then a usage error).
#[derive(Debug, Parser)]
#[command(name = "lull")]
enum Cli {
    /// `lull run`.
    Run(VmArgs),
}

const FLAGS: &[&str] = &[
    "--kernel",
    "--initramfs",
    "--cmdline",
    "--cpus",
    "--memory",
    "--irqchip",
    "--timer-model",
    "--timer-advance",
    "--cpu-quota",
    "--idle-inject",
    "--serial",
    "--metrics",
    "-v",
    "-vv",
    "--help",
    "run",
];

#[derive(Arbitrary, Debug)]
enum Word {
    Flag(u8),
    Value(String),
    Number(u64),
    Size(u32, u8),
}

impl Word {
    fn text(&self) -> String {
        match self {
            Word::Flag(i) => FLAGS[usize::from(*i) % FLAGS.len()].to_string(),
            Word::Value(s) => s.clone(),
            Word::Number(n) => n.to_string(),
            Word::Size(n, unit) => format!(
                "{n}{}",
                ["", "K", "M", "G", "k", "MiB", "b"][usize::from(*unit) % 7]
            ),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Input {
    Args(Vec<Word>),
    Json(Vec<u8>),
    Size(String),
    Serial(String),
}

fn args(words: &[Word]) {
    let mut argv = vec!["lull".to_string(), "run".to_string()];
    argv.extend(
        words
            .iter()
            .map(Word::text)
            .filter(|w| !w.starts_with("--config")),
    );
    let Ok(Cli::Run(run)) = Cli::try_parse_from(&argv) else {
        return;
    };
    assert!(run.config.is_none(), "--config was filtered out: {argv:?}");
    if let Ok(cfg) = run.to_config() {
        if let Err(e) = cfg.validate() {
            panic!("to_config accepted an invalid configuration ({e}): {argv:?}");
        }
        keeps_the_rules(&cfg);
    }
}

/// The rules `validate` promises, checked on a configuration it accepted.
fn keeps_the_rules(cfg: &VmConfig) {
    assert_eq!(cfg.memory.0 % 4096, 0, "unaligned memory accepted: {cfg:?}");
    if let Some(q) = cfg.cpu_quota {
        assert!(
            q.quota_ns < q.period_ns.saturating_mul(u64::from(cfg.cpus)),
            "a quota that never applies accepted: {cfg:?}"
        );
    }
    if cfg.irqchip == IrqchipMode::Kernel {
        assert_eq!(cfg.timer_model, ModelKind::Pull, "{cfg:?}");
        assert!(cfg.timer_advance.is_none(), "{cfg:?}");
    }
}

fn json(bytes: &[u8]) {
    let Ok(cfg) = serde_json::from_slice::<VmConfig>(bytes) else {
        return;
    };
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
        assert!(value.is_object(), "a JSON {value} parsed as a config");
    }
    if cfg.validate().is_ok() {
        keeps_the_rules(&cfg);
    }
    let text = serde_json::to_string(&cfg)
        .unwrap_or_else(|e| panic!("a parsed config does not serialize: {e}"));
    let back: VmConfig = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("config does not round-trip ({e}): {text}"));
    assert_eq!(back, cfg, "config changed in a round trip: {text}");
}

fn size(s: &str) {
    if let Ok(v) = s.parse::<ByteSize>() {
        let printed = v.to_string();
        assert_eq!(
            printed.parse::<ByteSize>(),
            Ok(v),
            "{s:?} printed as {printed:?}"
        );
    }
}

fn serial(s: &str) {
    if let Ok(v) = s.parse::<SerialMode>() {
        let printed = v.to_string();
        assert_eq!(
            printed.parse::<SerialMode>(),
            Ok(v),
            "{s:?} printed as {printed:?}"
        );
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    match Input::arbitrary_take_rest(Unstructured::new(data)) {
        Ok(Input::Args(words)) => args(&words),
        Ok(Input::Json(bytes)) => json(&bytes),
        Ok(Input::Size(s)) => size(&s),
        Ok(Input::Serial(s)) => serial(&s),
        Err(_) => {}
    }
}
