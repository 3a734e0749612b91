//! CPU time and memory of the processes under measurement, from /proc.

/// CPU time of processes over a scenario.
pub struct CpuMeter {
    pids: Vec<(&'static str, u32, f64)>,
}

impl CpuMeter {
    pub fn start(pids: Vec<(&'static str, Option<u32>)>) -> CpuMeter {
        CpuMeter {
            pids: pids
                .into_iter()
                .filter_map(|(name, pid)| {
                    let pid = pid?;
                    Some((name, pid, cpu_seconds(pid)?))
                })
                .collect(),
        }
    }

    pub fn finish(&self) -> Vec<(&'static str, f64)> {
        self.pids
            .iter()
            .filter_map(|(name, pid, start)| Some((*name, cpu_seconds(*pid)? - start)))
            .collect()
    }
}

/// User plus system CPU seconds of a process, from /proc (clock ticks of 10 ms).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Resident set size of a process, from /proc.
pub fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}
