//! The perftest tools run end to end over the virtual wire (short runs) and report.

use xwarp::verbs::perftest::{parse, run_vwire, Test};

fn run(test: Test, args: &[&str]) -> String {
    let o = parse(test, args.iter().map(Into::into).collect()).expect("options");
    run_vwire(test, &o).unwrap_or_else(|e| panic!("{test:?}: {e}"))
}

#[test]
fn bandwidth_tools_report_the_requested_iterations() {
    for (test, args) in [
        (
            Test::WriteBw,
            &["--vwire", "-s", "65536", "-n", "200", "-q", "2"][..],
        ),
        (Test::ReadBw, &["--vwire", "-s", "16384", "-n", "200"][..]),
        (
            Test::SendBw,
            &["--vwire", "-s", "4096", "-n", "1000", "-q", "2"][..],
        ),
    ] {
        let out = run(test, args);
        let line = out
            .lines()
            .skip_while(|l| !l.contains("#bytes"))
            .nth(1)
            .unwrap_or_else(|| panic!("{out}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        let qps: u64 = args
            .windows(2)
            .find(|w| w[0] == "-q")
            .map_or(1, |w| w[1].parse().unwrap());
        let n: u64 = args.windows(2).find(|w| w[0] == "-n").unwrap()[1]
            .parse()
            .unwrap();
        assert_eq!(cols[0], args[2], "{out}");
        assert_eq!(cols[1].parse::<u64>().unwrap(), n * qps, "{out}");
        assert!(cols[3].parse::<f64>().unwrap() > 0.0, "{out}");
    }
}

#[test]
fn latency_tools_report_percentiles() {
    for test in [Test::WriteLat, Test::ReadLat, Test::SendLat] {
        let out = run(test, &["--vwire", "-s", "64", "-n", "200"]);
        let line = out
            .lines()
            .skip_while(|l| !l.contains("t_min"))
            .nth(1)
            .unwrap_or_else(|| panic!("{out}"));
        let cols: Vec<f64> = line
            .split_whitespace()
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(cols[0], 64.0);
        assert_eq!(cols[1], 200.0);
        // min <= typical <= p99 <= p99.9 <= max
        assert!(
            cols[2] <= cols[4] && cols[4] <= cols[7] && cols[7] <= cols[8] && cols[8] <= cols[3],
            "{out}"
        );
    }
}

#[test]
fn duration_mode_stops_on_time() {
    let t0 = std::time::Instant::now();
    let out = run(Test::WriteBw, &["--vwire", "-s", "8192", "-D", "1"]);
    assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{out}");
    assert!(out.contains("BW average"));
}
