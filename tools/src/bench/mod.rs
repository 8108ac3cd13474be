//! `make bench`: Herald against the limits of the machine and the naive design, measured
//! side by side in one run on the real local stack. Every figure is the median of several
//! runs, with min and max. Results go to `bench/results/<date>.json` and `.md`.

pub mod compare;
pub mod cost;
pub mod delivery;
pub mod floor;
pub mod host;
pub mod ingest;
pub mod latency;
pub mod pooler;
pub mod procstat;
pub mod security;
pub mod storage;

use serde_json::{json, Value};

/// Repeated runs of one measurement.
#[derive(Debug, Clone)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub runs: Vec<f64>,
    pub note: String,
}

impl Figure {
    pub fn new(name: impl Into<String>, unit: &'static str, note: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            unit,
            runs: Vec::new(),
            note: note.into(),
        }
    }

    pub fn median(&self) -> f64 {
        let mut v = self.runs.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub fn min(&self) -> f64 {
        self.runs.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.runs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }

    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "unit": self.unit, "median": self.median(), "min": self.min(),
               "max": self.max(), "runs": self.runs, "note": self.note})
    }

    pub fn row(&self) -> String {
        format!(
            "| {} | {:.0} | {:.0} | {:.0} | {} | {} |",
            self.name,
            self.median(),
            self.min(),
            self.max(),
            self.unit,
            self.note
        )
    }
}

/// A target: `lhs >= factor * rhs`, checked on medians.
pub struct Target {
    pub text: String,
    pub lhs: f64,
    pub rhs: f64,
    pub factor: f64,
}

impl Target {
    pub fn met(&self) -> bool {
        self.lhs >= self.factor * self.rhs
    }

    pub fn row(&self) -> String {
        format!(
            "| {} | {:.2} | {} |",
            self.text,
            if self.rhs > 0.0 {
                self.lhs / self.rhs
            } else {
                f64::NAN
            },
            if self.met() { "met" } else { "**not met**" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let mut f = Figure::new("x", "events/s", "");
        f.runs = vec![3.0, 1.0, 2.0];
        assert_eq!((f.median(), f.min(), f.max()), (2.0, 1.0, 3.0));
        f.runs.push(4.0);
        assert_eq!(f.median(), 2.5);
        let t = Target {
            text: "a >= 10 x b".into(),
            lhs: 100.0,
            rhs: 10.0,
            factor: 10.0,
        };
        assert!(t.met());
    }
}
