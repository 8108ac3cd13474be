//! Herald's providers: e-mail through AWS SES v2, SMS through AWS SNS, the classification of
//! every provider result into accepted / rejected / retryable / unknown, and the per-channel
//! send-rate limit.
//!
//! One [`SesSender::send`] or [`SnsSender::send`] call is one attempt: one request, SDK
//! retries off. Whether and when to try again is the delivery worker's decision, taken from
//! the [`Outcome`]; this crate never sleeps and retries on its own. It does not touch
//! PostgreSQL or Kafka.
//!
//! The provider's evidence comes back through here too: [`evidence`] decodes SES event
//! records, [`queue`] reads the SQS queue they arrive on.

mod classify;
pub mod evidence;
mod message;
mod outcome;
pub mod queue;
mod rate;
mod ses;
mod settings;
pub mod sms_status;
mod sns;
mod tags;

pub use message::{EmailMessage, SmsMessage};
pub use outcome::{ErrorCategory, Outcome};
pub use rate::{RateLimiter, Reservation};
pub use ses::{IdentityError, SesSender};
pub use settings::{sdk_config, AwsSettings, StaticCredentials};
pub use sns::SnsSender;
