//! The numbers a front-end gives the networks linked to it ([`RemoteNumbers`]).

use treecast_proto::MAX_REMOTES;

use crate::ApiError;

/// The numbers a front-end gives the networks linked to it. A number freed is
/// given again only after every other one was: messages still on their way to a
/// network that went must not reach the next one.
#[derive(Debug, Default)]
pub(crate) struct RemoteNumbers {
    /// The numbers in use, with the serial of the link holding each.
    live: std::collections::BTreeMap<u32, u64>,
    next: u32,
    serial: u64,
}

impl RemoteNumbers {
    /// The next number not in use, and a serial for the link.
    ///
    /// # Errors
    /// [`ApiError::RemoteRefused`] when [`MAX_REMOTES`] networks are linked.
    pub(crate) fn take(&mut self) -> Result<(u32, u64), ApiError> {
        let free =
            (0..MAX_REMOTES).map(|k| (self.next + k) % MAX_REMOTES).find(|i| !self.live.contains_key(i));
        let index = free.ok_or_else(|| ApiError::RemoteRefused {
            peer: "this front-end".into(),
            why: format!("{MAX_REMOTES} networks are linked already; disconnect one first"),
        })?;
        self.next = (index + 1) % MAX_REMOTES;
        self.serial += 1;
        self.live.insert(index, self.serial);
        Ok((index, self.serial))
    }

    /// `index` is free again (its link closed, or was never made).
    pub(crate) fn give_back(&mut self, index: u32) {
        self.live.remove(&index);
    }

    /// Whether the link `serial` still holds `index`.
    pub(crate) fn is_live(&self, index: u32, serial: u64) -> bool {
        self.live.get(&index) == Some(&serial)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn numbers_go_round_before_one_is_given_again_and_run_out_at_the_limit() {
        let mut n = RemoteNumbers::default();
        let (a, b) = (n.take().unwrap(), n.take().unwrap());
        assert_eq!((a.0, b.0), (0, 1));
        n.give_back(0);
        assert!(!n.is_live(a.0, a.1) && n.is_live(b.0, b.1));
        assert_eq!(n.take().unwrap().0, 2, "not 0 again at once");
        for _ in 3..MAX_REMOTES {
            n.take().unwrap();
        }
        let again = n.take().unwrap();
        assert_eq!(again.0, 0, "once every other number is in use");
        assert!(!n.is_live(a.0, a.1), "an old handle does not name the new link");
        assert!(n.take().unwrap_err().to_string().contains("disconnect one"));
    }
}
