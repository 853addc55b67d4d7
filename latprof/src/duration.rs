//! Durations on the command line: `500ms`, `5s`, `2m`, `1h`, `250us`; a bare number is seconds.
use std::time::Duration;

/// Parses a duration; the error is one line for clap to print.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 500ms, 5s, 2m)"))?;
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "'{text}' has an unknown unit '{unit}' (use ns, us, ms, s, m or h)"
            ));
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > 1e9 {
        return Err(format!("'{text}' is too long"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration the way `parse` reads it.
#[must_use]
pub fn format(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0s".into()
    } else if ns % 1_000_000_000 == 0 {
        format!("{}s", ns / 1_000_000_000)
    } else if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns % 1_000 == 0 {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn rejects_garbage_with_one_line() {
        for bad in ["", "s", "5 parsecs", "-1s", "1e999", "abc"] {
            let err = parse(bad).unwrap_err();
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for d in ["5s", "500ms", "250us", "7ns", "0s"] {
            assert_eq!(format(parse(d).unwrap()), d);
        }
    }
}
