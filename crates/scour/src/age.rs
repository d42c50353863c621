//! The retention time of a scour.conf entry: `D`, `-hh`, `-hh:mm`, `D-hh` or `D-hh:mm` (days,
//! then hours and minutes of exactly two digits each), the forms LDM's scour(1) documents and
//! its parser accepts (its expression is `^([0-9]*)(-([0-9]{2})(:([0-9]{2}))?)?$`).
//!
//! The meaning is the documented one: days + hours + minutes. LDM 6.15's scour computes the
//! hours and minutes wrongly (it reads the hours with their minus sign and the minutes from the
//! hours' digits, in octal when they start with 0): "2-06:30" keeps files for 42 h 6 min there,
//! "-10" deletes every file, and days with a leading zero are octal ("010" = 8 days, "08" = 0).
//! docs/operations.md lists these differences; plain days without a leading zero mean the same in
//! both.

use std::fmt;
use std::time::Duration;

/// The most days an age may have: LDM's scour refuses more (its `DAYS_SINCE_1994`).
pub const DAYS_MAX: u32 = 9516;

/// A retention time: files whose modification time is at least this long ago are deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Age {
    /// Whole days.
    pub days: u32,
    /// Hours, 0–99.
    pub hours: u32,
    /// Minutes, 0–99.
    pub minutes: u32,
}

/// An age that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgeError {
    /// Not `D`, `-hh`, `-hh:mm`, `D-hh` or `D-hh:mm`.
    #[error(
        "age {text:?} is not D, -hh, -hh:mm, D-hh or D-hh:mm (days; hours and minutes of two digits each, e.g. 2, 1-12, 0-06:30)"
    )]
    Form {
        /// The text given.
        text: String,
    },
    /// More days than LDM accepts.
    #[error("age {text:?} is more than {DAYS_MAX} days (LDM's limit)")]
    TooManyDays {
        /// The text given.
        text: String,
    },
}

impl Age {
    /// Parses the AGE field of a scour.conf line.
    pub fn parse(text: &str) -> Result<Age, AgeError> {
        let form = || AgeError::Form { text: text.to_owned() };
        let (days_text, time_text) = match text.split_once('-') {
            Some((days, time)) => (days, Some(time)),
            None => (text, None),
        };
        if !days_text.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(form());
        }
        let days = if days_text.is_empty() {
            if time_text.is_none() {
                return Err(form());
            }
            0
        } else {
            // Digits only: the one failure left is overflow, which is too many days too.
            days_text
                .parse::<u32>()
                .ok()
                .filter(|days| *days <= DAYS_MAX)
                .ok_or_else(|| AgeError::TooManyDays { text: text.to_owned() })?
        };
        let (hours, minutes) = match time_text {
            None => (0, 0),
            Some(time) => {
                let (hours, minutes) = match time.split_once(':') {
                    Some((hours, minutes)) => (hours, Some(minutes)),
                    None => (time, None),
                };
                let hours = two_digits(hours).ok_or_else(form)?;
                let minutes = match minutes {
                    Some(minutes) => two_digits(minutes).ok_or_else(form)?,
                    None => 0,
                };
                (hours, minutes)
            }
        };
        Ok(Age { days, hours, minutes })
    }

    /// The retention time as a duration.
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The retention time in seconds.
    pub fn seconds(self) -> u64 {
        u64::from(self.days) * 86_400 + u64::from(self.hours) * 3600 + u64::from(self.minutes) * 60
    }
}

/// `2 days 06:30` style, for logs and `--check`.
impl fmt::Display for Age {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = if self.days == 1 { "day" } else { "days" };
        write!(f, "{} {unit} {:02}:{:02}", self.days, self.hours, self.minutes)
    }
}

fn two_digits(text: &str) -> Option<u32> {
    (text.len() == 2 && text.bytes().all(|byte| byte.is_ascii_digit())).then(|| text.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(days: u32, hours: u32, minutes: u32) -> Age {
        Age { days, hours, minutes }
    }

    #[test]
    fn every_documented_form_parses_to_days_hours_and_minutes() {
        assert_eq!(Age::parse("2"), Ok(age(2, 0, 0)));
        assert_eq!(Age::parse("444"), Ok(age(444, 0, 0)));
        assert_eq!(Age::parse("0"), Ok(age(0, 0, 0)));
        assert_eq!(Age::parse("-09"), Ok(age(0, 9, 0)));
        assert_eq!(Age::parse("-06:30"), Ok(age(0, 6, 30)));
        assert_eq!(Age::parse("33-11"), Ok(age(33, 11, 0)));
        assert_eq!(Age::parse("2-06:30"), Ok(age(2, 6, 30)));
        assert_eq!(Age::parse("0-09:30"), Ok(age(0, 9, 30)));
        assert_eq!(Age::parse("-00:00"), Ok(age(0, 0, 0)));
        // Two digits are all the form asks of hours and minutes, as LDM's expression.
        assert_eq!(Age::parse("1-99:99"), Ok(age(1, 99, 99)));
        // Days are decimal, leading zeros included (LDM reads them as octal).
        assert_eq!(Age::parse("010"), Ok(age(10, 0, 0)));
        assert_eq!(Age::parse("08"), Ok(age(8, 0, 0)));
        assert_eq!(Age::parse("9516"), Ok(age(DAYS_MAX, 0, 0)));
    }

    #[test]
    fn the_duration_adds_days_hours_and_minutes() {
        assert_eq!(Age::parse("2-06:30").unwrap().seconds(), 2 * 86_400 + 6 * 3600 + 30 * 60);
        assert_eq!(Age::parse("-10").unwrap().duration(), Duration::from_secs(36_000));
        assert_eq!(Age::parse("1-12").unwrap().to_string(), "1 day 12:00");
        assert_eq!(Age::parse("3").unwrap().to_string(), "3 days 00:00");
    }

    #[test]
    fn other_forms_are_refused_as_ldm_refuses_them() {
        // Each of these is refused by LDM 6.15's scour too ("Couldn't convert days-old
        // parameter"), checked against its binary.
        for bad in [
            "",
            "-",
            "3-",
            "1-",
            "2-6",
            "2-113055",
            "2-1130",
            "2:30",
            "+2",
            "2.5",
            "-1:30",
            "1-06:3",
            "1-06:",
            "x",
            "2d",
            "1-06:30:00",
            " 2",
            "２",
        ] {
            assert!(matches!(Age::parse(bad), Err(AgeError::Form { .. })), "{bad:?} was accepted");
        }
        assert!(matches!(Age::parse("9517"), Err(AgeError::TooManyDays { .. })));
        assert!(matches!(Age::parse("99999999999999999999"), Err(AgeError::TooManyDays { .. })));
        let message = Age::parse("2-113055").unwrap_err().to_string();
        assert!(message.contains("D-hh:mm") && message.contains("2-113055"), "{message}");
    }
}
