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
//! broker had acknowledged (delivery absorbs it), never a loss.

use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One message on its way: its outbox row and the task awaiting the broker's answer.
struct Pending {
    row: i64,
    answer: JoinHandle<herald_kafka::Result<()>>,
}

#[derive(Default)]
pub struct OnTheirWay {
    pending: Vec<Pending>,
}

/// What came back, by row.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Answered {
    /// Acknowledged: to delete.
    pub acknowledged: Vec<i64>,
    /// Refused or lost: to publish again.
    pub refused: Vec<i64>,
}

impl OnTheirWay {
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn add(&mut self, row: i64, answer: JoinHandle<herald_kafka::Result<()>>) {
        self.pending.push(Pending { row, answer });
    }

    /// Takes the messages that have their answer.
    pub async fn answered(&mut self) -> Answered {
        let mut out = Answered::default();
        let mut still = Vec::with_capacity(self.pending.len());
        for p in std::mem::take(&mut self.pending) {
            if !p.answer.is_finished() {
                still.push(p);
                continue;
            }
            match p.answer.await {
                Ok(Ok(())) => out.acknowledged.push(p.row),
                _ => out.refused.push(p.row),
            }
        }
        self.pending = still;
        out
    }

    /// Puts answers taken by [`OnTheirWay::answered`] back, for a round that could not
    /// record them.
    pub fn keep(&mut self, answered: Answered) {
        for row in answered.acknowledged {
            self.add(row, tokio::spawn(async { Ok(()) }));
        }
        for row in answered.refused {
            self.add(
                row,
                tokio::spawn(async {
                    Err(herald_kafka::KafkaError::Topic {
                        topic: String::new(),
                        detail: "refused".into(),
                    })
                }),
            );
        }
    }

    /// Waits until one of them has its answer, or until `deadline`.
    pub async fn wait_for_one(&mut self, deadline: Instant) {
        while !self.pending.iter().any(|p| p.answer.is_finished()) && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Waits until every one has its answer, or until `deadline`.
    pub async fn wait_for_all(&mut self, deadline: Instant) {
        while !self.pending.iter().all(|p| p.answer.is_finished()) && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn answers_are_taken_as_they_come_and_the_rest_stay_on_their_way() {
        let mut w = OnTheirWay::default();
        w.add(1, tokio::spawn(async { Ok(()) }));
        w.add(
            2,
            tokio::spawn(async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(())
            }),
        );
        w.add(
            3,
            tokio::spawn(async {
                Err(herald_kafka::KafkaError::Topic {
                    topic: "t".into(),
                    detail: "refused".into(),
                })
            }),
        );
        tokio::task::yield_now().await;
        let a = w.answered().await;
        assert_eq!(
            a,
            Answered {
                acknowledged: vec![1],
                refused: vec![3]
            }
        );
        assert_eq!(w.len(), 1, "the late one is still on its way");
        w.wait_for_one(Instant::now() + Duration::from_secs(120)).await;
        assert_eq!(w.answered().await.acknowledged, vec![2]);
        assert_eq!(w.len(), 0);
    }
}
