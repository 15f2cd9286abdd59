//! The date format of `BrokerProperties` (`EnqueuedTimeUtc`, `LockedUntilUtc`,
//! `ScheduledEnqueueTimeUtc`): RFC 1123, e.g. `Tue, 30 Nov 2026 10:00:00 GMT` (a numeric zone
//! such as `+0000` is read as well).

use std::time::{Duration, SystemTime};

/// RFC 1123 (`Tue, 30 Nov 2026 10:00:00 GMT`), the date format of BrokerProperties.
pub(super) fn http_date(t: SystemTime) -> String {
    httpdate(t)
}

fn httpdate(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{weekday}, {d:02} {} {year} {h:02}:{m:02}:{s:02} GMT",
        months[(month - 1) as usize]
    )
}

/// Parse an RFC 1123 / RFC 2822 date (`GMT` or `+0000`).
pub(super) fn parse_date(text: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_, day, month, year, time, _zone] = parts.as_slice() else {
        return None;
    };
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = months.iter().position(|m| m == month)? as i64 + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').filter_map(|p| p.parse().ok()).collect();
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    // Days from civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_in_rfc_1123() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_025_600);
        let text = http_date(t);
        assert_eq!(parse_date(&text), Some(t), "{text}");
        assert_eq!(
            http_date(SystemTime::UNIX_EPOCH),
            "Thu, 01 Jan 1970 00:00:00 GMT"
        );
    }
}
