//! The take stage: each delivery message goes to its channel's lane; a lane waits for room
//! in its channel's claim window, then in the pipeline, then starts the work (counts it in
//! flight with the consumer) and hands it to the claim stage.
//!
//! A channel's claim window holds what its rate can send within one lease
//! ([`herald_core::lease::LeaseBudget::claim_window`]): a claimed attempt of a slow
//! channel (an SES sandbox account at 1/s) then never waits past its lease, and a slow
//! channel holds up its own lane, not the other channel's, until the consumer's window
//! (`8 x max_in_flight` messages, at least 1,024) is full of its messages: both channels
//! share the deliveries topic and its partitions, so from there on the other waits too.
//! A message from a relay older than the channel header goes to a lane that takes room in
//! both windows and gives back the one its claim does not need.

use std::sync::Arc;

use herald_core::Channel;
use herald_kafka::deliver::{InFlight, Slot};
use herald_kafka::DeliveryMessage;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::DeliveryContext;
use crate::obs;

/// A message taken on: its work, its intent, and the permits it holds.
pub struct Taken {
    pub work: InFlight,
    pub intent_id: Uuid,
    pub permits: Permits,
    /// `process herald.deliveries`, child of the relay's `send` span; ends when the
    /// message is done (dropped with this).
    pub span: tracing::Span,
}

/// Room an attempt holds: in the pipeline until it is recorded, in its channel's claim
/// window until its send starts (or it ends without one).
pub struct Permits {
    _pipeline: OwnedSemaphorePermit,
    window: Vec<(Channel, OwnedSemaphorePermit)>,
}

impl Permits {
    /// The claim says which channel: the other window's room (a message without the
    /// channel header took both) is given back. False when the message held no room in
    /// that channel's window: its header named another channel than its intent's.
    pub fn claimed_as(&mut self, channel: Channel) -> bool {
        self.window.retain(|(c, _)| *c == channel);
        !self.window.is_empty()
    }

    /// The send starts: the channel's claim window has room again.
    pub fn release_window(&mut self) {
        self.window.clear();
    }
}

/// One lane: the channels whose window its messages take room in.
struct Lane {
    tx: mpsc::UnboundedSender<(Slot, DeliveryMessage)>,
    task: JoinHandle<()>,
}

/// The lanes of the take stage: one per channel, one for messages without a channel.
pub struct Lanes {
    email: Lane,
    sms: Lane,
    unlabelled: Lane,
    sizes: Vec<(Channel, usize)>,
}

impl Lanes {
    /// `pipeline`: the semaphore of `pipeline_size` attempts between take and record.
    pub fn spawn(
        ctx: &Arc<DeliveryContext>,
        pipeline: Arc<Semaphore>,
        pipeline_size: usize,
        claims: mpsc::Sender<Taken>,
    ) -> Self {
        // Never wider than the pipeline; at least one (validation refuses a lease that
        // cannot cover one send at the channel's rate).
        let size = |c: Channel| {
            ctx.budget
                .claim_window(ctx.config.rate_per_second(c))
                .clamp(1, pipeline_size.max(1))
        };
        let sizes: Vec<(Channel, usize)> = Channel::ALL.iter().map(|c| (*c, size(*c))).collect();
        let windows: Vec<(Channel, Arc<Semaphore>)> = sizes
            .iter()
            .map(|(c, n)| (*c, Arc::new(Semaphore::new(*n))))
            .collect();
        let window_of = |c: Channel| windows.iter().filter(|(w, _)| *w == c).cloned().collect();
        let lane = |windows: Vec<(Channel, Arc<Semaphore>)>| {
            let (tx, rx) = mpsc::unbounded_channel();
            let task = tokio::spawn(run_lane(
                ctx.clone(),
                windows,
                pipeline.clone(),
                rx,
                claims.clone(),
            ));
            Lane { tx, task }
        };
        Self {
            email: lane(window_of(Channel::Email)),
            sms: lane(window_of(Channel::Sms)),
            unlabelled: lane(windows.clone()),
            sizes,
        }
    }

    /// The claim window of each channel, for the start-up log.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .sizes
            .iter()
            .map(|(c, n)| format!("{}={n}", c.as_str()))
            .collect();
        parts.join(",")
    }

    /// Queues a message on its channel's lane. The queue is bounded by the consumer's
    /// window (it takes no more messages than that many outstanding).
    pub fn route(&self, slot: Slot, message: DeliveryMessage) {
        let lane = match message.channel {
            Some(Channel::Email) => &self.email,
            Some(Channel::Sms) => &self.sms,
            None => &self.unlabelled,
        };
        // A lane's receiver lives until `close`: sending cannot fail before.
        let _ = lane.tx.send((slot, message));
    }

    /// Stops the lanes (they return at shutdown) and waits for them; what they still
    /// queue was never started.
    pub async fn close(self) {
        for lane in [self.email, self.sms, self.unlabelled] {
            drop(lane.tx);
            let _ = lane.task.await;
        }
    }
}

async fn run_lane(
    ctx: Arc<DeliveryContext>,
    windows: Vec<(Channel, Arc<Semaphore>)>,
    pipeline: Arc<Semaphore>,
    mut rx: mpsc::UnboundedReceiver<(Slot, DeliveryMessage)>,
    claims: mpsc::Sender<Taken>,
) {
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let (slot, message) = tokio::select! {
            _ = shutdown.requested() => return,
            next = rx.recv() => match next {
                Some(m) => m,
                None => return,
            },
        };
        let mut window = Vec::with_capacity(windows.len());
        for (channel, room) in &windows {
            let permit = tokio::select! {
                _ = shutdown.requested() => return,
                p = room.clone().acquire_owned() => p,
            };
            let Ok(permit) = permit else { return }; // never closed
            window.push((*channel, permit));
        }
        let permit = tokio::select! {
            _ = shutdown.requested() => return,
            p = pipeline.clone().acquire_owned() => p,
        };
        let Ok(permit) = permit else { return };
        // Room in the claim stage's queue first: work is started only when it can be
        // handed over at once (started work must be completed, never dropped).
        let handover = tokio::select! {
            _ = shutdown.requested() => return,
            h = claims.reserve() => h,
        };
        let Ok(handover) = handover else { return };
        let Some(work) = ctx.handle.start(slot) else {
            continue; // its partition was revoked meanwhile: the next owner takes it
        };
        let span = if ctx.obs.tracing {
            obs::process_span(
                ctx.handle.topic(),
                &ctx.group,
                slot.partition,
                slot.offset,
                Some(&message.intent_id.to_string()),
                message.traceparent.as_deref(),
            )
        } else {
            tracing::Span::none()
        };
        let taken = Taken {
            work,
            intent_id: message.intent_id,
            permits: Permits {
                _pipeline: permit,
                window,
            },
            span,
        };
        handover.send(taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits(channels: &[Channel], windows: &Arc<Semaphore>) -> Permits {
        Permits {
            _pipeline: windows.clone().try_acquire_owned().unwrap(),
            window: channels
                .iter()
                .map(|c| (*c, windows.clone().try_acquire_owned().unwrap()))
                .collect(),
        }
    }

    /// A claim keeps only its channel's room, and says when the message held none there.
    #[test]
    fn a_claim_keeps_its_channels_room_and_notices_a_message_that_named_another() {
        let windows = Arc::new(Semaphore::new(10));
        let mut both = permits(&[Channel::Email, Channel::Sms], &windows);
        assert!(
            both.claimed_as(Channel::Sms),
            "a message without the header held both"
        );
        assert_eq!(
            windows.available_permits(),
            8,
            "the e-mail window's room given back"
        );
        let mut named = permits(&[Channel::Email], &windows);
        assert!(named.claimed_as(Channel::Email));
        let mut wrong = permits(&[Channel::Email], &windows);
        assert!(
            !wrong.claimed_as(Channel::Sms),
            "the header named e-mail, the intent is SMS"
        );
        drop((both, named, wrong));
        assert_eq!(windows.available_permits(), 10);
    }
}
