//! The delivery channels Herald knows. Stored as text (`email`, `sms`) with a CHECK
//! constraint, and used as a bounded metric label.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Email,
    Sms,
}

impl Channel {
    pub const ALL: [Channel; 2] = [Channel::Email, Channel::Sms];

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Email => "email",
            Channel::Sms => "sms",
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown channel {0:?}: expected \"email\" or \"sms\"")]
pub struct UnknownChannel(pub String);

impl FromStr for Channel {
    type Err = UnknownChannel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "email" => Ok(Channel::Email),
            "sms" => Ok(Channel::Sms),
            other => Err(UnknownChannel(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_round_trips_through_its_text_form() {
        for c in Channel::ALL {
            assert_eq!(c.as_str().parse::<Channel>().unwrap(), c);
        }
        assert!("fax".parse::<Channel>().is_err());
    }
}
