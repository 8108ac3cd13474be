//! The reconcile role's side, the providers' evidence: SES event records decoded
//! ([`ses_events`]) from the SQS queue they arrive on ([`queue`]) once their sender is
//! authenticated ([`sns`]: the envelope's topic and signature), and SNS's SMS delivery
//! status read from CloudWatch Logs ([`sms_status`]).

pub mod queue;
pub mod ses_events;
pub mod sms_status;
pub mod sns;
