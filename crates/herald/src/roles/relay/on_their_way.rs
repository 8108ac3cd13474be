//! Delivery messages a round published and stopped waiting for (`relay.ack_wait_ms`): a
//! partition whose leader is frozen, slow or being elected answers late, and a round that
//! waited for it held every row it had claimed, so every partition waited with it. Such a
//! message stays on its way in librdkafka (until the broker answers, or its
//! `message.timeout.ms`). Its round made its row due again only after that time, so no
//! relay claims it meanwhile; when the answer comes, a later round deletes the row
//! (acknowledged) or makes it due at once (refused: published again).
//!
//! Failure policy: a crash with messages on their way leaves their rows in the outbox, due
//! again once their deferral runs out: published again, a duplicate message for one the
//! broker had acknowledged (delivery absorbs it), never a loss. A send whose task panicked
//! has no answer: its row, likewise, is published again once its deferral runs out.

use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tracing::warn;
use uuid::Uuid;

/// One published message's answer from the broker, with its outbox row.
pub struct Sent {
    pub row: i64,
    pub intent_id: Uuid,
    pub answer: herald_kafka::Result<()>,
}

/// The messages on their way, each a task of its own (it outlives the round that
/// published it), and the answers taken from them that no round has recorded yet.
#[derive(Default)]
pub struct OnTheirWay {
    sends: JoinSet<Sent>,
    came: Answered,
}

/// What came back, by row.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Answered {
    /// Acknowledged: to delete.
    pub acknowledged: Vec<i64>,
    /// Refused or lost: to publish again.
    pub refused: Vec<i64>,
}

impl Answered {
    fn is_empty(&self) -> bool {
        self.acknowledged.is_empty() && self.refused.is_empty()
    }
}

impl OnTheirWay {
    /// Messages whose answer no round has recorded yet (on their way, or answered).
    pub fn len(&self) -> usize {
        self.sends.len() + self.came.acknowledged.len() + self.came.refused.len()
    }

    pub fn add(&mut self, send: impl std::future::Future<Output = Sent> + Send + 'static) {
        self.sends.spawn(send);
    }

    fn came(&mut self, joined: Result<Sent, JoinError>) {
        match joined {
            Ok(Sent {
                row, answer: Ok(()), ..
            }) => self.came.acknowledged.push(row),
            Ok(Sent {
                row, answer: Err(_), ..
            }) => self.came.refused.push(row),
            Err(e) => {
                warn!(error = %e, "a delivery message's send task failed; its row is published again once its deferral runs out")
            }
        }
    }

    /// Takes the answers that came, for a round to record.
    pub fn answered(&mut self) -> Answered {
        while let Some(joined) = self.sends.try_join_next() {
            self.came(joined);
        }
        std::mem::take(&mut self.came)
    }

    /// Puts answers taken by [`OnTheirWay::answered`] back, for a round that could not
    /// record them.
    pub fn keep(&mut self, answered: Answered) {
        self.came.acknowledged.extend(answered.acknowledged);
        self.came.refused.extend(answered.refused);
    }

    /// Waits until one of them has its answer, or until `deadline`.
    pub async fn wait_for_one(&mut self, deadline: Instant) {
        if !self.came.is_empty() {
            return;
        }
        if let Ok(Some(joined)) = tokio::time::timeout_at(deadline, self.sends.join_next()).await {
            self.came(joined);
        }
    }

    /// Waits until every one has its answer, or until `deadline`.
    pub async fn wait_for_all(&mut self, deadline: Instant) {
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, self.sends.join_next()).await {
            self.came(joined);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sent(row: i64, answer: herald_kafka::Result<()>) -> Sent {
        Sent {
            row,
            intent_id: Uuid::nil(),
            answer,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_taken_as_they_come_and_the_rest_stay_on_their_way() {
        let mut w = OnTheirWay::default();
        w.add(async { sent(1, Ok(())) });
        w.add(async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            sent(2, Ok(()))
        });
        w.add(async {
            sent(
                3,
                Err(herald_kafka::KafkaError::Topic {
                    topic: "t".into(),
                    detail: "refused".into(),
                }),
            )
        });
        tokio::task::yield_now().await;
        let a = w.answered();
        assert_eq!(
            a,
            Answered {
                acknowledged: vec![1],
                refused: vec![3]
            }
        );
        assert_eq!(w.len(), 1, "the late one is still on its way");
        w.keep(a.clone());
        assert_eq!(w.len(), 3, "answers kept count until recorded");
        assert_eq!(w.answered(), a, "kept answers come back");
        w.wait_for_one(Instant::now() + Duration::from_secs(120)).await;
        assert_eq!(w.answered().acknowledged, vec![2]);
        assert_eq!(w.len(), 0);
    }
}
