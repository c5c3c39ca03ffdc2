//! Host memory pressure: MemAvailable from /proc/meminfo and PSI from /proc/pressure/memory,
//! with a "sustained for" timer on PSI.

use std::path::Path;

use crate::config::HostMemoryConfig;

/// One reading of host memory.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostMem {
    /// MemTotal, KiB.
    pub total_kib: u64,
    /// MemAvailable, KiB.
    pub available_kib: u64,
    /// PSI `some avg10` in percent, when the kernel exposes PSI.
    pub psi_some_avg10: Option<f64>,
}

impl HostMem {
    /// MemAvailable as a percentage of MemTotal (100 when unknown).
    pub fn available_pct(&self) -> f64 {
        if self.total_kib == 0 {
            return 100.0;
        }
        self.available_kib as f64 * 100.0 / self.total_kib as f64
    }
}

/// Parses `MemTotal` and `MemAvailable` (kB) from /proc/meminfo text.
pub fn parse_meminfo(text: &str) -> Result<(u64, u64), String> {
    let field = |name: &str| -> Result<u64, String> {
        let line = text
            .lines()
            .find(|l| l.split(':').next() == Some(name))
            .ok_or_else(|| format!("no {name} line"))?;
        line.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("unreadable {name} line: {line:?}"))
    };
    Ok((field("MemTotal")?, field("MemAvailable")?))
}

/// Parses `avg10` of the `some` line of a PSI file.
pub fn parse_psi_some_avg10(text: &str) -> Result<f64, String> {
    let line = text
        .lines()
        .find(|l| l.starts_with("some "))
        .ok_or("no `some` line")?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no avg10 in {line:?}"))
}

/// Reads both files; PSI is optional (older kernels, containers without it).
pub fn read(meminfo: &Path, psi: &Path) -> Result<HostMem, String> {
    let m = std::fs::read_to_string(meminfo).map_err(|e| format!("{}: {e}", meminfo.display()))?;
    let (total_kib, available_kib) =
        parse_meminfo(&m).map_err(|e| format!("{}: {e}", meminfo.display()))?;
    let psi_some_avg10 = std::fs::read_to_string(psi)
        .ok()
        .and_then(|t| parse_psi_some_avg10(&t).ok());
    Ok(HostMem {
        total_kib,
        available_kib,
        psi_some_avg10,
    })
}

/// Decides when host memory pressure must evict offline work.
#[derive(Debug, Default)]
pub struct PressureJudge {
    psi_high_since: Option<u64>,
}

impl PressureJudge {
    /// Returns the eviction reason if the reading (taken at `now_ms`) is past the limits.
    pub fn judge(&mut self, cfg: &HostMemoryConfig, now_ms: u64, r: &HostMem) -> Option<String> {
        if !cfg.enabled {
            return None;
        }
        let psi_high = r
            .psi_some_avg10
            .is_some_and(|p| p >= cfg.psi_some_avg10_pct);
        if !psi_high {
            self.psi_high_since = None;
        }
        let avail = r.available_pct();
        if avail < cfg.min_available_pct {
            return Some(format!(
                "host MemAvailable {:.1}% below {:.1}%",
                avail, cfg.min_available_pct
            ));
        }
        if psi_high {
            let since = *self.psi_high_since.get_or_insert(now_ms);
            if now_ms.saturating_sub(since) >= cfg.psi_sustain_ms {
                return Some(format!(
                    "host memory PSI some avg10 {:.1}% >= {:.1}% for {} ms",
                    r.psi_some_avg10.unwrap_or_default(),
                    cfg.psi_some_avg10_pct,
                    now_ms - since
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    400000 kB\nBuffers: 1 kB\n";
    const PSI: &str = "some avg10=45.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=5\n";

    #[test]
    fn parses_proc_files() {
        assert_eq!(parse_meminfo(MEMINFO).unwrap(), (16_000_000, 400_000));
        assert_eq!(parse_psi_some_avg10(PSI).unwrap(), 45.5);
        assert!(parse_meminfo("MemTotal: 1 kB\n")
            .unwrap_err()
            .contains("MemAvailable"));
        assert!(parse_psi_some_avg10("full avg10=1").is_err());
    }

    #[test]
    fn low_available_memory_evicts_at_once() {
        let cfg = HostMemoryConfig::default();
        let mut j = PressureJudge::default();
        let r = HostMem {
            total_kib: 100,
            available_kib: 4,
            psi_some_avg10: None,
        };
        assert!(j.judge(&cfg, 0, &r).unwrap().contains("MemAvailable"));
        let r = HostMem {
            available_kib: 50,
            ..r
        };
        assert!(j.judge(&cfg, 1, &r).is_none());
    }

    #[test]
    fn psi_must_be_sustained() {
        let cfg = HostMemoryConfig {
            psi_sustain_ms: 1000,
            ..Default::default()
        };
        let mut j = PressureJudge::default();
        let hi = HostMem {
            total_kib: 100,
            available_kib: 50,
            psi_some_avg10: Some(60.0),
        };
        let lo = HostMem {
            psi_some_avg10: Some(1.0),
            ..hi
        };
        assert!(j.judge(&cfg, 0, &hi).is_none());
        assert!(j.judge(&cfg, 999, &hi).is_none());
        assert!(
            j.judge(&cfg, 500, &lo).is_none() && j.judge(&cfg, 1500, &hi).is_none(),
            "a dip restarts the timer"
        );
        assert!(j.judge(&cfg, 2500, &hi).unwrap().contains("PSI"));
    }

    #[test]
    fn disabled_never_evicts() {
        let cfg = HostMemoryConfig {
            enabled: false,
            ..Default::default()
        };
        let r = HostMem {
            total_kib: 100,
            available_kib: 0,
            psi_some_avg10: Some(100.0),
        };
        assert!(PressureJudge::default().judge(&cfg, 0, &r).is_none());
    }
}
