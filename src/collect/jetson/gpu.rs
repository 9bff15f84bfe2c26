//! Where the Jetson collector reads the GPU's clock and load, chosen again while it is on a
//! fallback instead of latched at start. Sources, best first: a GPU devfreq node
//! (`gpu-gpc-0` on Thor, `17000000.gpu`/`ga10b`/`gv11b`/... before it; clock from
//! `cur_freq`, `max_freq`, `available_frequencies`, load from `device/load` or `load` in
//! tenths of a percent), with the load taken from NVML where the node has no load file
//! (Thor) and NVML answers utilization; NVML alone (the `gpu` measurement) when there is no
//! devfreq node; else none. NVML is judged from its collector's status: a GPU that
//! answered `NotSupported` for utilization (Orin's nvgpu, on every JetPack) or that is lost
//! is not a source. A devfreq node with its own load is kept until it stops answering;
//! every other choice is a fallback, probed again at most once per `[jetson] gpu_reprobe`.
//! [`choose`] and [`nvml_answer`] are pure; [`GpuProbe`] holds the choice between samples.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::fs::{gpu_devfreq_nodes, name_of, read, read_num};

/// One read of a GPU devfreq node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    /// Clock now, MHz.
    pub freq_mhz: Option<f64>,
    /// Cap now (`max_freq`), MHz.
    pub max_mhz: Option<f64>,
    /// Highest clock of `available_frequencies`, MHz.
    pub hw_max_mhz: Option<f64>,
    /// Load, % (the node's `device/load` or `load`, in tenths of a percent).
    pub load_pct: Option<f64>,
}

/// Reads a GPU devfreq node; `None` when its clock cannot be read (gone, or not readable).
pub fn read_node(node: &Path) -> Option<GpuReading> {
    let mhz = |hz: f64| hz / 1e6;
    let freq_mhz = Some(mhz(read_num(&node.join("cur_freq"))?));
    let hw_max_mhz = read(&node.join("available_frequencies")).and_then(|s| {
        s.split_ascii_whitespace()
            .filter_map(|v| v.parse::<f64>().ok())
            .reduce(f64::max)
            .map(mhz)
    });
    let load_pct = read_num(&node.join("device/load"))
        .or_else(|| read_num(&node.join("load")))
        .map(|permille| (permille / 10.0).clamp(0.0, 100.0));
    Some(GpuReading {
        freq_mhz,
        max_mhz: read_num(&node.join("max_freq")).map(mhz),
        hw_max_mhz,
        load_pct,
    })
}

/// What the NVML collector says about GPU 0's utilization.
#[derive(Debug, Clone, PartialEq)]
pub enum NvmlAnswer {
    /// NVML is not running (its state line).
    Off(String),
    /// Running, but not sampled yet.
    Waiting,
    /// GPU 0 answered `NotSupported` for utilization (Tegra's nvgpu).
    NotSupported,
    /// GPU 0 is lost (fell off the bus, ...).
    Lost,
    /// GPU 0 answers utilization.
    Answers,
}

impl NvmlAnswer {
    fn why_not(&self) -> String {
        match self {
            NvmlAnswer::Off(state) => format!("NVML is not running ({state})"),
            NvmlAnswer::Waiting => "NVML has not sampled yet".into(),
            NvmlAnswer::NotSupported => {
                "NVML answers NotSupported for utilization (as on Tegra's nvgpu)".into()
            }
            NvmlAnswer::Lost => "NVML lost the GPU".into(),
            NvmlAnswer::Answers => "NVML answers utilization".into(),
        }
    }
}

/// NVML's answer from its collector's status. Pure.
pub fn nvml_answer(s: &crate::status::Nvml) -> NvmlAnswer {
    if s.state == "starting" || s.state == "not started" {
        return NvmlAnswer::Waiting;
    }
    if s.state != "running" {
        return NvmlAnswer::Off(s.state.clone());
    }
    if s.samples == 0 {
        return NvmlAnswer::Waiting;
    }
    match s.gpus.first() {
        None => NvmlAnswer::Off("no GPU listed".into()),
        Some(g) if g.lost => NvmlAnswer::Lost,
        Some(g) if g.unsupported.iter().any(|m| m == "utilization") => NvmlAnswer::NotSupported,
        Some(_) => NvmlAnswer::Answers,
    }
}

/// Where the GPU clock and load come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A devfreq node (its name).
    Devfreq(String),
    /// NVML's `gpu` measurement.
    Nvml,
    /// Nowhere.
    None,
}

/// A chosen source and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The clock's source (and the load's, unless `load_from_nvml`).
    pub source: Source,
    /// The load is NVML's (`gpu` measurement, `util_gpu_pct`): the devfreq node has none.
    pub load_from_nvml: bool,
    /// Why, in one sentence.
    pub reason: String,
}

impl Choice {
    /// `devfreq:<node>` (`+nvml` when the load is NVML's), `nvml`, `none`.
    pub fn label(&self) -> String {
        match &self.source {
            Source::Devfreq(n) if self.load_from_nvml => format!("devfreq:{n}+nvml"),
            Source::Devfreq(n) => format!("devfreq:{n}"),
            Source::Nvml => "nvml".into(),
            Source::None => "none".into(),
        }
    }

    /// A devfreq node with its own load: kept until it stops answering. Anything else is a
    /// fallback, probed again.
    pub fn settled(&self) -> bool {
        matches!(self.source, Source::Devfreq(_)) && !self.load_from_nvml
    }
}

/// Chooses from the GPU devfreq nodes (best first, with what each answered) and NVML's
/// answer. Pure.
pub fn choose(nodes: &[(String, Option<GpuReading>)], nvml: &NvmlAnswer) -> Choice {
    let answering = nodes.iter().find_map(|(n, r)| r.as_ref().map(|r| (n, r)));
    if let Some((n, r)) = answering {
        let (load_from_nvml, reason) = if r.load_pct.is_some() {
            (
                false,
                format!("GPU devfreq node {n} answers clock and load"),
            )
        } else if *nvml == NvmlAnswer::Answers {
            (
                true,
                format!("GPU devfreq node {n} answers the clock but has no load file; the load is NVML's (gpu measurement, util_gpu_pct)"),
            )
        } else {
            (
                false,
                format!(
                    "GPU devfreq node {n} answers the clock but has no load file, and {}: no GPU load",
                    nvml.why_not()
                ),
            )
        };
        return Choice {
            source: Source::Devfreq(n.clone()),
            load_from_nvml,
            reason,
        };
    }
    let nodes_note = if nodes.is_empty() {
        "no GPU devfreq node under sys/class/devfreq".to_string()
    } else {
        let names: Vec<&str> = nodes.iter().map(|(n, _)| n.as_str()).collect();
        format!("GPU devfreq node {} does not answer", names.join(", "))
    };
    if *nvml == NvmlAnswer::Answers {
        Choice {
            source: Source::Nvml,
            load_from_nvml: true,
            reason: format!("{nodes_note}; NVML answers utilization (gpu measurement)"),
        }
    } else {
        Choice {
            source: Source::None,
            load_from_nvml: false,
            reason: format!("{nodes_note}, and {}", nvml.why_not()),
        }
    }
}

/// The chosen source between samples, probed again on a fallback.
#[derive(Debug)]
pub struct GpuProbe {
    every: Duration,
    last: Option<Instant>,
    choice: Option<Choice>,
    node: Option<PathBuf>,
    /// Times the source changed after the first choice.
    pub switches: u64,
}

impl GpuProbe {
    /// A probe that looks again at most every `every` while on a fallback.
    pub fn new(every: Duration) -> GpuProbe {
        GpuProbe {
            every,
            last: None,
            choice: None,
            node: None,
            switches: 0,
        }
    }

    /// The current choice.
    pub fn choice(&self) -> Option<&Choice> {
        self.choice.as_ref()
    }

    /// One sample: the chosen node's reading (none unless on devfreq), and `(old, new)`
    /// when this sample chose anew and the source changed (`old` is `None` the first time).
    pub fn sample(
        &mut self,
        root: &Path,
        nvml: impl FnOnce() -> NvmlAnswer,
        now: Instant,
    ) -> (Option<GpuReading>, Option<(Option<Choice>, Choice)>) {
        let due = match &self.choice {
            None => true,
            Some(c) => {
                !c.settled()
                    && self
                        .last
                        .map_or(true, |t| now.saturating_duration_since(t) >= self.every)
            }
        };
        if !due {
            // Settled or between probes: read the chosen node; one that stops answering is
            // probed away from at once.
            match &self.node {
                Some(node) => {
                    if let Some(r) = read_node(node) {
                        return (Some(r), None);
                    }
                }
                None => return (None, None),
            }
        }
        self.last = Some(now);
        let nodes: Vec<(PathBuf, Option<GpuReading>)> = gpu_devfreq_nodes(root)
            .into_iter()
            .map(|p| {
                let r = read_node(&p);
                (p, r)
            })
            .collect();
        let named: Vec<(String, Option<GpuReading>)> =
            nodes.iter().map(|(p, r)| (name_of(p), r.clone())).collect();
        let choice = choose(&named, &nvml());
        let (node, reading) = match &choice.source {
            Source::Devfreq(n) => nodes
                .into_iter()
                .find(|(p, _)| name_of(p) == *n)
                .map_or((None, None), |(p, r)| (Some(p), r)),
            _ => (None, None),
        };
        self.node = node;
        let key = |c: &Choice| (c.source.clone(), c.load_from_nvml);
        let changed = self.choice.as_ref().map(key) != Some(key(&choice));
        let old = self.choice.replace(choice.clone());
        if !changed {
            return (reading, None);
        }
        if old.is_some() {
            self.switches += 1;
        }
        (reading, Some((old, choice)))
    }
}
