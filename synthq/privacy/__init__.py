"""Privacy: the guarantee type and its composition, accounting, the owner's keys and keyed digests,
units and unit sets, and the run ledger."""
