//! The deliver role's side: one attempt through SES v2 ([`ses`]) or SNS ([`sns`]), the
//! message it sends ([`message`], [`tags`]), every result classified ([`classify`]) into an
//! [`outcome::Outcome`], and the per-channel send rate ([`rate`]).

pub(crate) mod classify;
pub(crate) mod message;
pub(crate) mod outcome;
pub(crate) mod rate;
pub(crate) mod ses;
pub(crate) mod sns;
pub(crate) mod tags;
