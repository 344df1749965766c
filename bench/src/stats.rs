//! Latency samples and their percentiles.

use std::time::Duration;

/// p50, p90, p99 and max of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub count: usize,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(samples: &mut [Duration]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        // Nearest rank: the smallest sample with at least q of the samples at or below it.
        let rank = |q: f64| {
            let n = samples.len();
            let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
            samples[i].as_micros() as u64
        };
        Percentiles {
            count: samples.len(),
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: samples[samples.len() - 1].as_micros() as u64,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count,
            "p50_us": self.p50,
            "p90_us": self.p90,
            "p99_us": self.p99,
            "max_us": self.max,
        })
    }
}

/// Microseconds as milliseconds with three decimals.
pub fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let p = Percentiles::of(&mut samples);
        assert_eq!(
            (p.count, p.p50, p.p90, p.p99, p.max),
            (100, 50, 90, 99, 100)
        );
        let mut one = vec![Duration::from_micros(7)];
        let p = Percentiles::of(&mut one);
        assert_eq!((p.p50, p.p99, p.max), (7, 7, 7));
        assert_eq!(Percentiles::of(&mut []).count, 0);
    }
}
