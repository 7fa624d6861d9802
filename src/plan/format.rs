//! How the planner writes its figures: counts with their thousands
//! separated, bytes in their unit.

/// `x` rounded to a whole number, with thousands separated by commas:
/// 36,330 (the benchmark's charts write counts so too).
pub fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if x < -0.5 {
        out.insert(0, '-');
    }
    out
}

/// Bytes in the largest unit below 1,000 of it.
pub(super) fn bytes(x: f64) -> String {
    match x {
        x if x >= 1e12 => format!("{:.1} TB", x / 1e12),
        x if x >= 1e9 => format!("{:.1} GB", x / 1e9),
        x if x >= 1e6 => format!("{:.1} MB", x / 1e6),
        x if x >= 1e3 => format!("{:.1} kB", x / 1e3),
        x => format!("{x:.0} B"),
    }
}
