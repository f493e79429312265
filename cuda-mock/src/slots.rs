//! Slot machinery shared by the simulated libraries (this crate's driver, nccl-sys's NCCL).
//!
//! A C function pointer carries no state, so each simulated world gets its own instances
//! of the functions: every mock function is generic over a slot number `W`, and a world
//! claims one of [`MAX_WORLDS`] slots for its life.

/// How many simulated drivers can exist at once in one process.
pub const MAX_WORLDS: usize = 64;

/// Declares the slot table for a world type: `claim_slot`, `release_slot`, `slot_world`.
#[doc(hidden)]
#[macro_export]
macro_rules! __mock_slots {
    ($world:ty) => {
        static SLOTS: [::std::sync::RwLock<Option<::std::sync::Arc<$world>>>; $crate::MAX_WORLDS] =
            [const { ::std::sync::RwLock::new(None) }; $crate::MAX_WORLDS];

        /// Claims a free slot for `world`.
        pub(super) fn claim_slot(world: ::std::sync::Arc<$world>) -> Option<usize> {
            for (i, slot) in SLOTS.iter().enumerate() {
                let mut g = slot.write().unwrap_or_else(|e| e.into_inner());
                if g.is_none() {
                    *g = Some(world);
                    return Some(i);
                }
            }
            None
        }

        /// Frees a slot.
        pub(super) fn release_slot(slot: usize) {
            if let Some(s) = SLOTS.get(slot) {
                *s.write().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }

        /// The world of a slot, while it is claimed.
        fn slot_world(slot: usize) -> Option<::std::sync::Arc<$world>> {
            SLOTS
                .get(slot)?
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }
    };
}

/// An array of a generic lookup function instantiated for every slot.
#[doc(hidden)]
#[macro_export]
macro_rules! __mock_lookups {
    ($lookup:ident) => {
        [
            $lookup::<0>,
            $lookup::<1>,
            $lookup::<2>,
            $lookup::<3>,
            $lookup::<4>,
            $lookup::<5>,
            $lookup::<6>,
            $lookup::<7>,
            $lookup::<8>,
            $lookup::<9>,
            $lookup::<10>,
            $lookup::<11>,
            $lookup::<12>,
            $lookup::<13>,
            $lookup::<14>,
            $lookup::<15>,
            $lookup::<16>,
            $lookup::<17>,
            $lookup::<18>,
            $lookup::<19>,
            $lookup::<20>,
            $lookup::<21>,
            $lookup::<22>,
            $lookup::<23>,
            $lookup::<24>,
            $lookup::<25>,
            $lookup::<26>,
            $lookup::<27>,
            $lookup::<28>,
            $lookup::<29>,
            $lookup::<30>,
            $lookup::<31>,
            $lookup::<32>,
            $lookup::<33>,
            $lookup::<34>,
            $lookup::<35>,
            $lookup::<36>,
            $lookup::<37>,
            $lookup::<38>,
            $lookup::<39>,
            $lookup::<40>,
            $lookup::<41>,
            $lookup::<42>,
            $lookup::<43>,
            $lookup::<44>,
            $lookup::<45>,
            $lookup::<46>,
            $lookup::<47>,
            $lookup::<48>,
            $lookup::<49>,
            $lookup::<50>,
            $lookup::<51>,
            $lookup::<52>,
            $lookup::<53>,
            $lookup::<54>,
            $lookup::<55>,
            $lookup::<56>,
            $lookup::<57>,
            $lookup::<58>,
            $lookup::<59>,
            $lookup::<60>,
            $lookup::<61>,
            $lookup::<62>,
            $lookup::<63>,
        ]
    };
}

/// Releases a slot when the last owner drops; held by the built library handle.
#[doc(hidden)]
pub struct SlotGuard {
    /// The slot.
    pub slot: usize,
    /// The function that frees it.
    pub release: fn(usize),
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        (self.release)(self.slot);
    }
}
