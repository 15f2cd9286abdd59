//! The offsets of one processing consumer's assigned partitions: which fetched messages are
//! buffered, handed out or settled, the offset to commit — the end of the **contiguous
//! prefix** of settled offsets, so a message that finished early never lets the commit skip
//! one still in flight — and the delivered mark, below which a fetched offset is a replay of
//! a message this group fetched before. Pure bookkeeping, no I/O: the consumer's poll thread
//! commits what it reports.

use std::collections::{BTreeMap, HashMap};

/// Where one fetched message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Fetched, not handed out (or handed back).
    Buffered,
    /// Handed out to the host, not settled.
    Out,
    /// Settled: its offset may be committed once every earlier one is.
    Settled,
}

/// One assigned partition.
#[derive(Debug)]
struct Part {
    generation: u64,
    /// Fetched offsets not yet part of the committed prefix.
    pending: BTreeMap<i64, State>,
    /// One past the highest fetched offset (or where consumption starts).
    fetched_end: Option<i64>,
    /// The last offset committed (the next message to consume), if any.
    committed: Option<i64>,
    /// The delivered mark as stored: offsets below it were fetched by this group before.
    mark: i64,
    /// Offsets below this were fetched before this assignment: replays.
    replay_below: i64,
}

impl Part {
    /// The offset to commit: the first unsettled fetched offset, or past everything fetched.
    fn commit_point(&self) -> Option<i64> {
        self.pending.keys().next().copied().or(self.fetched_end)
    }

    fn pop_settled(&mut self) {
        while let Some(entry) = self.pending.first_entry() {
            if *entry.get() != State::Settled {
                break;
            }
            entry.remove();
        }
    }
}

/// What the tracker says about a fetched message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetched {
    /// The assignment it belongs to.
    pub generation: u64,
    /// This group fetched it before (a previous owner or run did not commit it).
    pub replay: bool,
}

/// A processing offset to commit: the next message to consume of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
}

/// The partitions of one consumer.
#[derive(Debug, Default)]
pub struct Tracker {
    parts: HashMap<i32, Part>,
    generations: u64,
}

impl Tracker {
    /// `partition` was assigned; `committed` is the group's committed offset and `mark` the
    /// stored delivered mark (each when there is one). Returns its generation.
    pub fn assign(&mut self, partition: i32, committed: Option<i64>, mark: Option<i64>) -> u64 {
        self.generations += 1;
        let replay_below = mark.unwrap_or(0).max(committed.unwrap_or(0));
        self.parts.insert(
            partition,
            Part {
                generation: self.generations,
                pending: BTreeMap::new(),
                fetched_end: committed,
                committed,
                mark: replay_below,
                replay_below,
            },
        );
        self.generations
    }

    /// How many times partitions were assigned (a new assignment needs pausing again).
    pub fn generations(&self) -> u64 {
        self.generations
    }

    /// A message at `offset` of `partition` was fetched; `None` when the partition is not
    /// assigned (a stale fetch of a revoked partition: drop it).
    pub fn fetched(&mut self, partition: i32, offset: i64) -> Option<Fetched> {
        let part = self.parts.get_mut(&partition)?;
        part.pending.insert(offset, State::Buffered);
        part.fetched_end = Some(part.fetched_end.map_or(offset + 1, |e| e.max(offset + 1)));
        Some(Fetched {
            generation: part.generation,
            replay: offset < part.replay_below,
        })
    }

    fn entry(&mut self, partition: i32, generation: u64, offset: i64) -> Option<&mut State> {
        let part = self.parts.get_mut(&partition)?;
        if part.generation != generation {
            return None;
        }
        part.pending.get_mut(&offset)
    }

    /// Hand a buffered message out; false when its partition was revoked meanwhile.
    pub fn hand_out(&mut self, partition: i32, generation: u64, offset: i64) -> bool {
        match self.entry(partition, generation, offset) {
            Some(state) if *state == State::Buffered => {
                *state = State::Out;
                true
            }
            _ => false,
        }
    }

    /// Whether a handed-out message is still held (its partition not revoked).
    pub fn holds(&self, partition: i32, generation: u64, offset: i64) -> bool {
        self.parts.get(&partition).is_some_and(|p| {
            p.generation == generation && p.pending.get(&offset) == Some(&State::Out)
        })
    }

    /// A handed-out message was settled; false when it was no longer held.
    pub fn settle(&mut self, partition: i32, generation: u64, offset: i64) -> bool {
        match self.entry(partition, generation, offset) {
            Some(state) if *state == State::Out => {
                *state = State::Settled;
                self.parts
                    .get_mut(&partition)
                    .expect("just found")
                    .pop_settled();
                true
            }
            _ => false,
        }
    }

    /// A handed-out message was handed back: buffered again, its offset not committed.
    pub fn hand_back(&mut self, partition: i32, generation: u64, offset: i64) -> bool {
        match self.entry(partition, generation, offset) {
            Some(state) if *state == State::Out => {
                *state = State::Buffered;
                true
            }
            _ => false,
        }
    }

    /// Handed-out, unsettled messages of `partitions`.
    pub fn out(&self, partitions: &[i32]) -> usize {
        partitions
            .iter()
            .filter_map(|p| self.parts.get(p))
            .map(|p| p.pending.values().filter(|s| **s == State::Out).count())
            .sum()
    }

    /// Partitions whose delivered mark is behind what was fetched: their mark must be stored
    /// before the fetched messages are handed out (so a crash while one runs makes its
    /// next delivery a counted replay).
    pub fn marks_behind(&mut self) -> Vec<(i32, i64)> {
        let mut behind = Vec::new();
        for (&partition, part) in &mut self.parts {
            if let Some(end) = part.fetched_end
                && end > part.mark
            {
                part.mark = end;
                behind.push((partition, end));
            }
        }
        behind
    }

    /// Commits whose offset moved since the last one (taken as committed).
    pub fn commits(&mut self) -> Vec<Commit> {
        let mut out = Vec::new();
        for (&partition, part) in &mut self.parts {
            if let Some(point) = part.commit_point()
                && Some(point) > part.committed
            {
                part.committed = Some(point);
                out.push(Commit {
                    partition,
                    offset: point,
                });
            }
        }
        out
    }

    /// A commit of `partition` failed: send it again next time.
    pub fn commit_failed(&mut self, partition: i32) {
        if let Some(part) = self.parts.get_mut(&partition) {
            part.committed = None;
        }
    }

    /// Forget `partitions` (revoked); returns their last commits.
    pub fn revoke(&mut self, partitions: &[i32]) -> Vec<Commit> {
        let mut out = Vec::new();
        for partition in partitions {
            if let Some(part) = self.parts.remove(partition)
                && let Some(point) = part.commit_point()
                && Some(point) > part.committed
            {
                out.push(Commit {
                    partition: *partition,
                    offset: point,
                });
            }
        }
        out
    }

    /// The assigned partitions.
    pub fn partitions(&self) -> Vec<i32> {
        self.parts.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(t: &mut Tracker, p: i32, offsets: std::ops::Range<i64>) -> u64 {
        let mut generation = 0;
        for o in offsets {
            generation = t.fetched(p, o).unwrap().generation;
            assert!(t.hand_out(p, generation, o));
        }
        generation
    }

    fn offsets(commits: Vec<Commit>) -> Vec<(i32, i64)> {
        let mut v: Vec<(i32, i64)> = commits
            .into_iter()
            .map(|c| (c.partition, c.offset))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_commit_waits_for_the_slow_first_message() {
        let mut t = Tracker::default();
        t.assign(0, Some(10), None);
        let g = take(&mut t, 0, 10..14);
        assert!(t.settle(0, g, 11) && t.settle(0, g, 12) && t.settle(0, g, 13));
        assert!(t.commits().is_empty(), "10 still runs: nothing past it");
        assert!(t.settle(0, g, 10));
        assert_eq!(offsets(t.commits()), vec![(0, 14)]);
        assert!(t.commits().is_empty(), "reported once");
    }

    #[test]
    fn gaps_in_offsets_do_not_hold_the_commit() {
        let mut t = Tracker::default();
        t.assign(0, None, None);
        let g = t.fetched(0, 5).unwrap().generation;
        t.fetched(0, 8).unwrap();
        assert!(t.hand_out(0, g, 5) && t.hand_out(0, g, 8));
        assert!(t.settle(0, g, 8));
        assert_eq!(
            offsets(t.commits()),
            vec![(0, 5)],
            "up to the first unsettled"
        );
        assert!(t.settle(0, g, 5));
        assert_eq!(offsets(t.commits()), vec![(0, 9)]);
    }

    #[test]
    fn replays_are_offsets_below_the_stored_mark() {
        let mut t = Tracker::default();
        t.assign(3, Some(100), Some(104));
        assert!(t.fetched(3, 103).unwrap().replay);
        assert!(!t.fetched(3, 104).unwrap().replay);
        assert_eq!(t.marks_behind(), vec![(3, 105)]);
        assert!(t.marks_behind().is_empty(), "stored once");
    }

    #[test]
    fn a_revoked_partition_holds_nothing_and_reports_its_last_commit() {
        let mut t = Tracker::default();
        t.assign(1, Some(0), None);
        let g = take(&mut t, 1, 0..3);
        assert!(t.settle(1, g, 0));
        assert_eq!(t.out(&[1]), 2);
        assert_eq!(offsets(t.revoke(&[1])), vec![(1, 1)]);
        assert!(!t.holds(1, g, 1));
        assert!(!t.settle(1, g, 1), "settling after revocation is not held");
        assert!(t.fetched(1, 3).is_none(), "a stale fetch is dropped");
        let g2 = t.assign(1, Some(1), Some(3));
        assert_ne!(g, g2);
        assert!(!t.settle(1, g, 2), "an old generation's handle is not held");
    }

    #[test]
    fn a_handed_back_message_holds_the_commit() {
        let mut t = Tracker::default();
        t.assign(0, Some(0), None);
        let g = take(&mut t, 0, 0..2);
        assert!(t.hand_back(0, g, 0));
        assert!(!t.holds(0, g, 0));
        assert!(t.settle(0, g, 1));
        assert!(t.commits().is_empty());
        assert_eq!(t.out(&[0]), 0);
        assert!(t.hand_out(0, g, 0) && t.settle(0, g, 0));
        assert_eq!(offsets(t.commits()), vec![(0, 2)]);
    }
}
