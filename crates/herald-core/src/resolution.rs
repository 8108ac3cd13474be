//! An operator's decision on an intent whose last attempt's outcome is `unknown`
//! (`herald intent resolve --as ...`, `POST /v1/intents/{id}/resolve`): one type for the
//! command line, the admin API and the store.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    /// The seller got it: the intent becomes `accepted`.
    Accepted,
    /// Send again: the next attempt is flagged as following an `unknown`.
    Retry,
}

impl Resolution {
    pub const ALL: [Resolution; 2] = [Resolution::Accepted, Resolution::Retry];

    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Accepted => "accepted",
            Resolution::Retry => "retry",
        }
    }
}

impl fmt::Display for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A text that names no [`Resolution`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a resolution: expected accepted or retry")]
pub struct UnknownResolution(pub String);

impl FromStr for Resolution {
    type Err = UnknownResolution;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Resolution::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownResolution(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_serde_and_parsing_agree() {
        for r in Resolution::ALL {
            assert_eq!(r.as_str().parse::<Resolution>(), Ok(r));
            assert_eq!(serde_json::to_value(r).unwrap(), serde_json::json!(r.as_str()));
            assert_eq!(
                serde_json::from_value::<Resolution>(serde_json::json!(r.as_str())).unwrap(),
                r
            );
        }
        assert!("Accepted".parse::<Resolution>().is_err());
        assert!(serde_json::from_value::<Resolution>(serde_json::json!("failed")).is_err());
    }
}
