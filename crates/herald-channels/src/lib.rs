//! Herald's providers: e-mail through AWS SES v2, SMS through AWS SNS, the classification of
//! every provider result into accepted / rejected / retryable / unknown, and the per-channel
//! send-rate limit.
//!
//! One [`SesSender::send`] or [`SnsSender::send`] call is one attempt: one request, SDK
//! retries off. Whether and when to try again is the delivery worker's decision, taken from
//! the [`Outcome`]; this crate never sleeps and retries on its own. It does not touch
//! PostgreSQL or Kafka.
//!
//! | stage | modules |
//! |---|---|
//! | deliver | `deliver`: `ses`, `sns`, `message`, `tags`, `classify`, `outcome`, `rate` |
//! | reconcile | [`reconcile`]: `ses_events` (SES event records), `queue` (the SQS queue they arrive on), `sms_status` (SNS's SMS delivery status in CloudWatch Logs) |
//! | both | `settings` (the AWS SDK's configuration) |

mod deliver;
pub mod reconcile;
mod settings;

pub use deliver::message::{EmailMessage, SmsMessage};
pub use deliver::outcome::{ErrorCategory, Outcome};
pub use deliver::rate::{RateLimiter, Reservation};
pub use deliver::ses::{IdentityError, SesSender};
pub use deliver::sns::SnsSender;
pub use settings::{sdk_config, AwsSettings, StaticCredentials};
