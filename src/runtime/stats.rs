//! Median, spread and noise: how every timing the engine takes (tuning,
//! healing, the cost model's probes, the graph layer's calibration) is
//! summarised and compared, in one place, so that "faster beyond the
//! noise" means the same thing wherever a choice depends on it.

use std::time::Duration;

/// The least relative difference two timings are told apart by, whatever
/// their spreads say: below it, two plans are as fast.
pub(crate) const NOISE: f64 = 0.05;

/// The median and the spread (interquartile range over the median) of
/// `xs`, quantiles linear between the two nearest ranks; `None` without a
/// finite sample.
pub(crate) fn summary(xs: &[f64]) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let at = p * (v.len() as f64 - 1.0);
        let lo = at.floor();
        let i = lo as usize;
        let a = v.get(i).copied().unwrap_or(0.0);
        let b = v.get(i.saturating_add(1)).copied().unwrap_or(a);
        a + (b - a) * (at - lo)
    };
    let med = q(0.5);
    let spread = if med > 0.0 {
        (q(0.75) - q(0.25)) / med
    } else {
        0.0
    };
    Some((med, spread))
}

/// The median of a few probe durations (the upper one of an even count);
/// zero for none.
pub(crate) fn median_duration(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Whether `a` is slower than `b` beyond the noise: their ratio past one
/// by more than their spreads together, or than [`NOISE`].
pub(crate) fn slower(a: f64, b: f64, spreads: f64) -> bool {
    a > b * (1.0 + spreads.max(NOISE))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_spread() {
        assert_eq!(summary(&[]), None);
        assert_eq!(summary(&[f64::NAN]), None);
        assert_eq!(summary(&[2.0]), Some((2.0, 0.0)));
        let (m, s) = summary(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!(m, 3.0);
        assert!((s - 2.0 / 3.0).abs() < 1e-12);
        // One 10x spike moves neither.
        let (m, s) = summary(&[1.0, 1.0, 10.0, 1.0, 1.0]).unwrap();
        assert_eq!((m, s), (1.0, 0.0));
    }

    #[test]
    fn durations_take_the_upper_median() {
        let ms = Duration::from_millis;
        assert_eq!(median_duration(vec![]), Duration::ZERO);
        assert_eq!(median_duration(vec![ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(median_duration(vec![ms(4), ms(1), ms(3), ms(2)]), ms(3));
    }

    #[test]
    fn slower_means_beyond_the_spreads_or_the_floor() {
        assert!(!slower(1.04, 1.0, 0.0));
        assert!(slower(1.06, 1.0, 0.0));
        assert!(!slower(1.15, 1.0, 0.2));
        assert!(slower(1.25, 1.0, 0.2));
    }
}
