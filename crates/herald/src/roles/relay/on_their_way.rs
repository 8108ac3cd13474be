//! Delivery messages a round published and stopped waiting for (`relay.ack_wait_ms`): a
//! partition whose leader is frozen, slow or being elected answers late, and a round that
//! waited for it held every row it had claimed, so every partition waited with it. Such a
//! message stays on its way in librdkafka (until the broker answers or its
//! `message.timeout.ms`); its row stays in the outbox, unlocked, and this relay's later
//! rounds skip it (`claim_due`'s skip list) until the answer comes: acknowledged, the row is
//! deleted by the next round; refused, it is forgotten here and the row published again.
//!
//! Failure policy: a crash with messages on their way leaves their rows in the outbox: a
//! later relay publishes them again (a duplicate message if the first was acknowledged,
//! which delivery absorbs). Another relay instance may claim such a row meanwhile (it is
//! not locked): the same duplicate, never a loss.

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

/// What came back since the last look.
#[derive(Debug, Default)]
pub struct Answered {
    /// Rows whose messages the broker acknowledged: to delete.
    pub acknowledged: Vec<i64>,
    /// Messages refused or lost: their rows are published again.
    pub refused: usize,
}

impl OnTheirWay {
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// The rows to skip when claiming.
    pub fn rows(&self) -> Vec<i64> {
        self.pending.iter().map(|p| p.row).collect()
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
                _ => out.refused += 1,
            }
        }
        self.pending = still;
        out
    }

    /// Waits until one of them has its answer, or until `deadline`.
    pub async fn wait_for_one(&mut self, deadline: Instant) {
        while !self.pending.iter().any(|p| p.answer.is_finished()) && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn answers_are_taken_as_they_come_and_the_rest_stay_skipped() {
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
        assert_eq!(a.acknowledged, vec![1]);
        assert_eq!(a.refused, 1);
        assert_eq!(w.rows(), vec![2], "the late one is still skipped");
        w.wait_for_one(Instant::now() + Duration::from_secs(120)).await;
        assert_eq!(w.answered().await.acknowledged, vec![2]);
        assert_eq!(w.len(), 0);
    }
}
