//! Settling a consuming session's deliveries in as few frames as the broker allows. The
//! session notes every delivery tag as it is pushed ([`Unsettled::delivered`]); a batch of
//! acknowledgements whose tags, together, are every unsettled delivery up to the highest of
//! them is one `basic.ack` with `multiple` set, the rest one frame each. A rejection is one
//! `basic.nack` per tag, never `multiple`, so it never settles a delivery it was not given.
//!
//! Only for a channel with one consumer: its deliveries are pushed in tag order, so a tag
//! below one being settled is already noted here. The frames of one batch are written
//! before those of the next (the broker refuses a tag that a `multiple` ack already settled,
//! and closes the channel).

use std::collections::BTreeSet;

use futures_util::future::maybe_done;
use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicNackOptions};

/// The unsettled deliveries of one session.
#[derive(Default)]
pub(super) struct Unsettled {
    tags: std::sync::Mutex<BTreeSet<u64>>,
    /// Held while a batch's frames are written.
    writing: tokio::sync::Mutex<()>,
}

/// The frames that acknowledge a batch.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    /// One `multiple` ack up to this tag.
    up_to: Option<u64>,
    /// One ack each.
    each: Vec<u64>,
}

impl Unsettled {
    /// Note a pushed delivery.
    pub(super) fn delivered(&self, tag: u64) {
        self.tags.lock().expect("unsettled tags").insert(tag);
    }

    /// Acknowledge `tags` (each a delivery of this session).
    pub(super) async fn ack(&self, channel: &Channel, tags: &[u64]) -> lapin::Result<()> {
        let _writing = self.writing.lock().await;
        let plan = plan(&mut self.tags.lock().expect("unsettled tags"), tags);
        let multiple = plan.up_to.map(|tag| (tag, true));
        let each = plan.each.iter().map(|&tag| (tag, false));
        let mut acks: Vec<_> = multiple
            .into_iter()
            .chain(each)
            .map(|(tag, multiple)| {
                Box::pin(maybe_done(
                    channel.basic_ack(tag, BasicAckOptions { multiple }),
                ))
            })
            .collect();
        // A frame is queued when its ack is first polled: poll each once, in order, then
        // wait for them all to be written.
        for ack in &mut acks {
            let _ = futures_util::poll!(ack.as_mut());
        }
        for ack in &mut acks {
            ack.as_mut().await;
            if let Some(Err(e)) = ack.as_mut().take_output() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Reject `tags` (each a delivery of this session), one frame each.
    pub(super) async fn nack(
        &self,
        channel: &Channel,
        tags: &[u64],
        requeue: bool,
    ) -> lapin::Result<()> {
        let _writing = self.writing.lock().await;
        {
            let mut unsettled = self.tags.lock().expect("unsettled tags");
            for tag in tags {
                unsettled.remove(tag);
            }
        }
        let options = BasicNackOptions {
            multiple: false,
            requeue,
        };
        for &tag in tags {
            channel.basic_nack(tag, options).await?;
        }
        Ok(())
    }
}

/// The frames that acknowledge `tags`, taking them out of `unsettled`: the longest run of
/// the lowest unsettled tags that are all in `tags` is one `multiple` ack (when it has two
/// or more), every other tag an ack of its own.
fn plan(unsettled: &mut BTreeSet<u64>, tags: &[u64]) -> Plan {
    let acked: BTreeSet<u64> = tags.iter().copied().collect();
    let run: Vec<u64> = unsettled
        .iter()
        .take_while(|tag| acked.contains(tag))
        .copied()
        .collect();
    for tag in &acked {
        unsettled.remove(tag);
    }
    let up_to = match run.len() {
        0 | 1 => None,
        _ => run.last().copied(),
    };
    let each = acked
        .into_iter()
        .filter(|tag| up_to.is_none_or(|up_to| *tag > up_to))
        .collect();
    Plan { up_to, each }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(unsettled: &[u64], tags: &[u64]) -> (Plan, Vec<u64>) {
        let mut set: BTreeSet<u64> = unsettled.iter().copied().collect();
        let plan = plan(&mut set, tags);
        (plan, set.into_iter().collect())
    }

    #[test]
    fn the_lowest_unsettled_deliveries_are_one_multiple_ack() {
        let (plan, left) = planned(&[3, 4, 5, 6, 9], &[5, 4, 3]);
        assert_eq!(
            plan,
            Plan {
                up_to: Some(5),
                each: vec![]
            }
        );
        assert_eq!(left, [6, 9]);
    }

    #[test]
    fn a_delivery_still_running_below_keeps_the_acks_apart() {
        // 3 is still running: a `multiple` ack would settle it.
        let (plan, left) = planned(&[3, 4, 5], &[4, 5]);
        assert_eq!(
            plan,
            Plan {
                up_to: None,
                each: vec![4, 5]
            }
        );
        assert_eq!(left, [3]);
    }

    #[test]
    fn after_the_run_each_tag_has_its_own_ack() {
        let (plan, left) = planned(&[1, 2, 3, 4, 5, 6], &[1, 2, 4, 6]);
        assert_eq!(
            plan,
            Plan {
                up_to: Some(2),
                each: vec![4, 6]
            }
        );
        assert_eq!(left, [3, 5]);
    }

    #[test]
    fn a_run_of_one_is_a_plain_ack() {
        let (plan, _) = planned(&[7, 8], &[7]);
        assert_eq!(
            plan,
            Plan {
                up_to: None,
                each: vec![7]
            }
        );
    }
}
